// main() of an emulated .metal file.  Included last by the translation unit
// prepass.py writes, after the kernels table kEmuKernels.
//
//   emu list
//   emu launch KERNEL GX GY GZ TX TY TZ INDEX=FILE...
//       runs KERNEL over GX*GY*GZ threadgroups of TX*TY*TZ threads; every
//       FILE is read into a heap block of exactly its size (so the address
//       sanitizer catches any access past it) and written back afterwards.
//   emu probe NAME IN_FILE OUT_FILE N_OUT
//       evaluates an index probe on int64 values.
#include <fstream>
#include <iostream>
#include <iterator>

namespace metal_emu {

inline std::vector<unsigned char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(f), {});
}

inline void write_file(const std::string& path, const unsigned char* data, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n));
  if (!f) throw std::runtime_error("cannot write " + path);
}

inline int launch_main(int argc, char** argv) {
  if (argc < 9) throw std::runtime_error("usage: launch KERNEL GX GY GZ TX TY TZ INDEX=FILE...");
  const std::string name = argv[2];
  const KernelEntry* entry = nullptr;
  for (const auto& k : kEmuKernels) {
    if (name == k.name) entry = &k;
  }
  if (!entry) throw std::runtime_error("no kernel named " + name);
  const uint3 groups(std::stoul(argv[3]), std::stoul(argv[4]), std::stoul(argv[5]));
  const uint3 threads(std::stoul(argv[6]), std::stoul(argv[7]), std::stoul(argv[8]));
  struct Bound {
    std::string path;
    std::unique_ptr<unsigned char[]> data;
    size_t size;
  };
  std::map<int, Bound> bound;
  for (int a = 9; a < argc; ++a) {
    const std::string arg = argv[a];
    const auto eq = arg.find('=');
    if (eq == std::string::npos) throw std::runtime_error("bad buffer argument " + arg);
    const int index = std::stoi(arg.substr(0, eq));
    const std::vector<unsigned char> bytes = read_file(arg.substr(eq + 1));
    Bound b{arg.substr(eq + 1), std::unique_ptr<unsigned char[]>(new unsigned char[bytes.size()]),
            bytes.size()};
    if (!bytes.empty()) std::memcpy(b.data.get(), bytes.data(), bytes.size());
    bound[index] = std::move(b);
  }
  void* table[32] = {};
  for (int index : entry->buffers) {
    auto it = bound.find(index);
    if (it == bound.end()) {
      throw std::runtime_error(name + " reads [[buffer(" + std::to_string(index) +
                               ")]] but nothing is bound there");
    }
    table[index] = it->second.data.get();
  }
  const std::string error = run_grid(groups, threads, entry->synchronised,
                                     [&](const ThreadContext& c) { entry->body(table, c); });
  if (!error.empty()) throw std::runtime_error(name + ": " + error);
  for (auto& [index, b] : bound) write_file(b.path, b.data.get(), b.size);
  return 0;
}

inline int probe_main(int argc, char** argv) {
  if (argc != 6) throw std::runtime_error("usage: probe NAME IN_FILE OUT_FILE N_OUT");
  auto it = probes().find(argv[2]);
  if (it == probes().end()) throw std::runtime_error(std::string("no probe named ") + argv[2]);
  const std::vector<unsigned char> in = read_file(argv[3]);
  std::vector<long> in_values(in.size() / sizeof(long) + 1);
  std::memcpy(in_values.data(), in.data(), in.size());
  std::vector<long> out(std::stoul(argv[5]));
  it->second(in_values.data(), out.data());
  write_file(argv[4], reinterpret_cast<const unsigned char*>(out.data()), out.size() * sizeof(long));
  return 0;
}

}  // namespace metal_emu

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "list") {
      for (const auto& k : kEmuKernels) std::cout << k.name << (k.synchronised ? " sync" : "") << "\n";
      for (const auto& [name, fn] : metal_emu::probes()) std::cout << name << " probe\n";
      return 0;
    }
    if (mode == "launch") return metal_emu::launch_main(argc, argv);
    if (mode == "probe") return metal_emu::probe_main(argc, argv);
    std::cerr << "usage: emu list | launch ... | probe ...\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "metal-emu error: " << e.what() << "\n";
    return 3;
  }
}
