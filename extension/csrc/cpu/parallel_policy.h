// How the CPU kernels share a call among threads: by the work the call does, not by
// how many elements it touches.
//
// A kernel states its work as items (what one chunk of the loop may take: rois,
// (roi, channel) pairs, channels) and the work of one item, in units of about one
// scalar multiply-add on one element (a bilinear sample on one channel: 4 units).
// A call below kParallelWork units (about a millisecond on one core) runs on
// the calling thread: waking a second thread costs tens of microseconds on an idle
// machine and, on a busy one, can cost a scheduler time slice (milliseconds) while
// the caller waits for it. Above it, the items are handed out in chunks of about
// kChunkWork units (at most 8 a thread) from a shared counter, so a thread that the scheduler holds
// back takes fewer chunks instead of holding up the call with a fixed half of it; the call
// waits only for threads that took a chunk, never for one that has not run (work_pool.h).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <limits>

#include "../abi.h"
#include "work_pool.h"

namespace opforge::cpu {

constexpr int64_t kParallelWork = int64_t(1) << 22;
constexpr int64_t kChunkWork = int64_t(1) << 18;

// `items * item_work`, saturating instead of overflowing.
inline int64_t total_work(int64_t items, int64_t item_work) {
  item_work = std::max<int64_t>(item_work, 1);
  if (items > std::numeric_limits<int64_t>::max() / item_work) {
    return std::numeric_limits<int64_t>::max();
  }
  return items * item_work;
}

// Whether a call of this much work may use more than one thread at all.
inline bool worth_threads(int64_t items, int64_t item_work) {
  return items > 1 && total_work(items, item_work) >= kParallelWork && num_threads() > 1;
}

// Calls f(begin, end) over [0, items) in chunks, on one thread or several as the work
// asks; f must be safe to run on disjoint ranges at once. The threads are the calling one and
// the extension's own pool (work_pool.h); a call made inside a chunk, or while another thread's
// call holds the pool, runs on its own thread. The first exception a chunk throws is rethrown
// here.
template <typename F>
void parallel_for_work(int64_t items, int64_t item_work, const F& f) {
  if (items <= 0) {
    return;
  }
  if (pool::t_in_pool || !worth_threads(items, item_work)) {
    f(int64_t(0), items);
    return;
  }
  const int64_t threads = num_threads();
  const int64_t per_thread = (items + threads - 1) / threads;
  // At most 8 chunks a thread: a chunk may repeat per-call set-up (a roi's sampling grid).
  const int64_t fewest = (items + threads * 8 - 1) / (threads * 8);
  const int64_t chunk =
      std::clamp<int64_t>(kChunkWork / std::max<int64_t>(item_work, 1), fewest, per_thread);
  pool::Job job;
  job.run = &pool::run_chunk<F>;
  job.body = &f;
  job.items = items;
  job.chunk = chunk;
  job.chunks = (items + chunk - 1) / chunk;
  job.helpers = static_cast<int>(std::min(threads, job.chunks) - 1);
  pool::Pool& workers = pool::instance();
  if (job.helpers < 1 || workers.backing_off() || !workers.run(job)) {
    f(int64_t(0), items);
  }
}

}  // namespace opforge::cpu
