// The extension's own worker pool, behind parallel_for_work (parallel_policy.h), in both builds.
//
// Why not at::parallel_for: in torch's Linux wheels it is an OpenMP team, and a team's join is
// a barrier. On a busy machine the caller may finish every chunk itself and still wait a
// scheduler time slice (milliseconds) for a second thread that has not run yet. Here the caller
// posts a job and claims chunks from it itself; idle workers wake and claim chunks too. When
// every chunk is claimed the caller takes the job down and waits only for the workers that
// joined it while it was up (each of them holds a claimed chunk or is about to find none), never
// for one that has not run.
//
// The rules the code below keeps:
// - a worker joins and leaves a job under the pool's mutex, and joins only while the job is up;
//   the caller takes the job down under that mutex and returns once no worker is in it, so a
//   worker that wakes late can never reach a job that has returned;
// - one job at a time: a call made while the pool is busy (another Python thread, a DataLoader
//   thread) or from inside a chunk (nesting) runs all its items on its own thread;
// - idle workers sleep on a condition variable; they spin only briefly after a job (kSpinNs),
//   for the next call of a sequence of ops;
// - a caller that had to wait on a worker that claimed a chunk and was then preempted (far
//   longer than the rest of a chunk) makes later calls stay on their own thread for a while
//   (judge_wait): on a machine with more runnable threads than cores a second thread costs a
//   time slice, not a speed-up;
// - the first exception from a chunk is kept and rethrown on the caller; no new chunk starts;
// - after fork() the child gets a fresh pool (the parent's threads do not exist there: the old
//   pool is leaked, not touched); the pool is never destroyed, so exit joins no thread;
// - on a worker, and on the caller while it runs a job's chunks, ATen, OpenMP and MKL are told
//   to stay on that thread (ThreadCap): a chunk that calls an ATen op (deform_conv2d's products
//   call bmm) must not start a nested team on a machine the pool already fills.
#pragma once

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>

#include <dlfcn.h>

#include "../abi.h"

#ifndef OPFORGE_STABLE_ABI
#include <c10/util/ParallelGuard.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

namespace opforge::cpu::pool {

// How long an idle worker keeps looking for the next job before it sleeps.
constexpr int64_t kSpinNs = 50'000;

// ---- thread caps: one thread for ATen, OpenMP and MKL on this thread -------------------------

namespace detail {
using SetInt = void (*)(int);
using GetInt = int (*)();
using SetIntRet = int (*)(int);

struct RuntimeHooks {
  SetInt omp_set = nullptr;       // omp_set_num_threads: this thread's ICV
  GetInt omp_get = nullptr;       // omp_get_max_threads
  SetIntRet mkl_local = nullptr;  // mkl_set_num_threads_local: this thread's MKL setting
};

// The OpenMP runtime torch uses (libgomp.so.1, loaded with torch) and MKL (linked statically
// into libtorch_cpu.so, which exports MKL_Set_Num_Threads_Local: the C entry point that
// mkl.h names mkl_set_num_threads_local; the lower-case symbol is the Fortran one, which takes
// a pointer). Looked up, not linked: a
// stable-ABI build links neither, and a torch without MKL has no such symbol.
inline const RuntimeHooks& hooks() {
  static const RuntimeHooks found = [] {
    RuntimeHooks h;
#ifdef _OPENMP
    h.omp_set = &omp_set_num_threads;
    h.omp_get = &omp_get_max_threads;
#else
    if (void* gomp = dlopen("libgomp.so.1", RTLD_LAZY | RTLD_NOLOAD)) {
      h.omp_set = reinterpret_cast<SetInt>(dlsym(gomp, "omp_set_num_threads"));
      h.omp_get = reinterpret_cast<GetInt>(dlsym(gomp, "omp_get_max_threads"));
      if (!h.omp_set || !h.omp_get) {
        h.omp_set = nullptr;
        h.omp_get = nullptr;
      }
    }
#endif
    if (void* cpu = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD)) {
      h.mkl_local = reinterpret_cast<SetIntRet>(dlsym(cpu, "MKL_Set_Num_Threads_Local"));
    }
    return h;
  }();
  return found;
}
}  // namespace detail

// While alive, ops called on this thread run on this thread alone: at::parallel_for runs inline
// (c10::ParallelGuard, legacy build), OpenMP regions get one thread (this thread's
// nthreads-var ICV) and MKL uses one thread (its thread-local setting). The stable ABI has no
// ParallelGuard; there the OpenMP ICV does the same for at::parallel_for (a team of one).
class ThreadCap {
 public:
  ThreadCap()
#ifndef OPFORGE_STABLE_ABI
      : parallel_guard_(true)
#endif
  {
    const auto& h = detail::hooks();
    if (h.omp_set) {
      omp_before_ = h.omp_get();
      if (omp_before_ != 1) {
        h.omp_set(1);
      }
    }
    if (h.mkl_local) {
      mkl_before_ = h.mkl_local(1);
    }
  }
  ~ThreadCap() {
    const auto& h = detail::hooks();
    if (h.omp_set && omp_before_ != 1) {
      h.omp_set(omp_before_);
    }
    if (h.mkl_local) {
      h.mkl_local(mkl_before_);
    }
  }
  ThreadCap(const ThreadCap&) = delete;
  ThreadCap& operator=(const ThreadCap&) = delete;

 private:
#ifndef OPFORGE_STABLE_ABI
  c10::ParallelGuard parallel_guard_;
#endif
  int omp_before_ = 1;
  int mkl_before_ = 0;
};

// ---- jobs ----------------------------------------------------------------------------------

// A job's chunk body as a function of its own (also on the caller, as an OpenMP region's body
// was: inlined into a kernel, a loop body may spill registers).
template <typename F>
[[gnu::noinline]] void run_chunk(const void* body, int64_t begin, int64_t end) {
  (*static_cast<const F*>(body))(begin, end);
}

// One parallel_for_work call: `chunks` chunks of `chunk` items over [0, items), run by
// run(body, begin, end). Lives on the caller's stack.
struct Job {
  void (*run)(const void* body, int64_t begin, int64_t end) = nullptr;
  const void* body = nullptr;
  int64_t items = 0;
  int64_t chunk = 1;
  int64_t chunks = 0;
  int helpers = 0;  // how many workers may join
  std::atomic<int64_t> next{0};
  // Under the pool's mutex:
  int joined = 0;  // workers that joined so far
  int inside = 0;  // workers in it now
  std::exception_ptr error;

  // Claims and runs chunks until none is left or one throws; the first exception is kept.
  // Returns how many chunks this thread ran.
  int64_t work(std::mutex& lock) noexcept {
    int64_t ran = 0;
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
         c = next.fetch_add(1, std::memory_order_relaxed), ++ran) {
      try {
        run(body, c * chunk, std::min(items, (c + 1) * chunk));
      } catch (...) {
        next.store(chunks, std::memory_order_relaxed);  // no new chunk starts
        const std::lock_guard<std::mutex> guard(lock);
        if (!error) {
          error = std::current_exception();
        }
        return ran;
      }
    }
    return ran;
  }
};

// The thread the code runs on is a pool worker, or a caller running a job's chunks.
inline thread_local bool t_in_pool = false;

class Pool {
 public:
  using Clock = std::chrono::steady_clock;

  // Whether calls should stay on their own thread for now: the last jobs made their callers
  // wait on a worker (below).
  bool backing_off() const {
    return Clock::now().time_since_epoch().count() < backoff_until_.load(std::memory_order_relaxed);
  }

  // Runs job on the calling thread and up to job.helpers workers; returns once every chunk has
  // run (or one threw: rethrown here). False, having run nothing, when the pool is busy.
  bool run(Job& job) {
    if (busy_.exchange(true, std::memory_order_acquire)) {
      return false;
    }
    struct Release {
      std::atomic<bool>& busy;
      ~Release() { busy.store(false, std::memory_order_release); }
    } release{busy_};
    {
      std::unique_lock<std::mutex> lk(mutex_);
      while (spawned_ < job.helpers) {
        try {
          std::thread(&Pool::worker_loop, this).detach();
        } catch (const std::system_error&) {
          break;  // no thread to be had: fewer helpers
        }
        ++spawned_;
      }
      job.helpers = std::min(job.helpers, spawned_);
      posted_ = &job;
      posted_seq_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    const auto started = Clock::now();
    int64_t ran = 0;
    {
      t_in_pool = true;
      ThreadCap cap;
      ran = job.work(mutex_);
      t_in_pool = false;
    }
    const auto claimed = Clock::now();
    {
      std::unique_lock<std::mutex> lk(mutex_);
      posted_ = nullptr;
      left_.wait(lk, [&] { return job.inside == 0; });
    }
    judge_wait(started, claimed, Clock::now(), ran);
    if (job.error) {
      std::rethrow_exception(job.error);
    }
    return true;
  }

 private:
  bool can_join(const Job* job) const {
    return job && job->joined < job->helpers &&
           job->next.load(std::memory_order_relaxed) < job->chunks;
  }

  [[noreturn]] void worker_loop() {
    t_in_pool = true;
    // ATen sets a new thread's OpenMP and MKL thread counts on the thread's first query
    // (at::internal::lazy_init_num_threads): query first, so that the cap below stays.
    (void)num_threads();
    ThreadCap cap;  // for the thread's whole life
    std::unique_lock<std::mutex> lk(mutex_);
    for (;;) {
      if (!can_join(posted_)) {
        // A short spin first: the next op of a sequence posts within microseconds.
        const uint64_t seen = posted_seq_.load(std::memory_order_acquire);
        lk.unlock();
        const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(kSpinNs);
        while (posted_seq_.load(std::memory_order_acquire) == seen &&
               std::chrono::steady_clock::now() < until) {
#if defined(__x86_64__) || defined(__i386__)
          __builtin_ia32_pause();
#endif
        }
        lk.lock();
        wake_.wait(lk, [&] { return can_join(posted_); });
      }
      Job* job = posted_;
      ++job->joined;
      ++job->inside;
      lk.unlock();
      job->work(mutex_);
      lk.lock();
      if (--job->inside == 0 && posted_ != job) {
        left_.notify_all();
      }
    }
  }

  // After the caller has claimed the last chunk it waits for the workers still inside the
  // job. On a quiet machine that is at most the rest of one chunk. A wait of more than two of
  // the caller's own chunks (and over kWaitFloorNs) means a worker that claimed a chunk was
  // preempted: the machine has more runnable threads than cores, and a second thread costs a
  // scheduler time slice instead of saving time. Then calls stay on their own thread for a
  // while (kBackoffNs, doubling while such waits go on, up to kBackoffMaxNs), after which the
  // next large call tries the workers again; a job without such a wait resets the period.
  void judge_wait(Clock::time_point started, Clock::time_point claimed, Clock::time_point done,
                  int64_t ran) {
    using std::chrono::duration_cast;
    using std::chrono::nanoseconds;
    const int64_t worked = duration_cast<nanoseconds>(claimed - started).count();
    const int64_t waited = duration_cast<nanoseconds>(done - claimed).count();
    // a caller that ran no chunk (the workers took them all) has nothing to compare with
    if (ran > 0 && waited > kWaitFloorNs && waited > 2 * (worked / ran)) {
      const int64_t period = std::min(backoff_ns_ * 2, kBackoffMaxNs);
      backoff_ns_ = period;
      backoff_until_.store(
          (done + duration_cast<Clock::duration>(nanoseconds(period))).time_since_epoch().count(),
          std::memory_order_relaxed);
    } else {
      backoff_ns_ = kBackoffNs / 2;
    }
  }

  static constexpr int64_t kWaitFloorNs = 200'000;
  static constexpr int64_t kBackoffNs = 100'000'000;
  static constexpr int64_t kBackoffMaxNs = 1'600'000'000;
  int64_t backoff_ns_ = kBackoffNs / 2;       // only the pool's holder (busy_) touches it
  std::atomic<Clock::rep> backoff_until_{0};  // steady_clock ticks

  std::mutex mutex_;
  std::condition_variable wake_;  // workers: a job was posted
  std::condition_variable left_;  // the caller: a worker left its job
  std::atomic<bool> busy_{false};
  std::atomic<uint64_t> posted_seq_{0};
  Job* posted_ = nullptr;  // under mutex_
  int spawned_ = 0;        // under mutex_
};

// ---- the process's pool ----------------------------------------------------------------------

inline std::atomic<Pool*> g_pool{nullptr};

inline void after_fork_in_child() {
  // The parent's workers do not exist here, and its pool's mutex may have been held at the
  // fork: leave that pool alone (leaked) and let the next call make a new one.
  g_pool.store(nullptr, std::memory_order_relaxed);
  t_in_pool = false;
}

inline Pool& instance() {
  Pool* pool = g_pool.load(std::memory_order_acquire);
  if (pool) {
    return *pool;
  }
  static std::atomic<bool> fork_handler{false};
  if (!fork_handler.exchange(true)) {
    pthread_atfork(nullptr, nullptr, &after_fork_in_child);
  }
  Pool* fresh = new Pool();  // never deleted: exit must not join (or wait for) any thread
  if (g_pool.compare_exchange_strong(pool, fresh, std::memory_order_acq_rel)) {
    return *fresh;
  }
  delete fresh;  // another thread made one first; this one started no thread
  return *pool;
}

}  // namespace opforge::cpu::pool
