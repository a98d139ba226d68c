// Replays the seed corpus through the fuzz target without libFuzzer, so the
// gcc build (bazel test //tests/fuzz:roce_parse_corpus_test) exercises the
// same properties on every run: each seed as is, every prefix of it, and a
// few hundred deterministic byte and bit mutations of it.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(argv[1], ec))
    if (e.is_regular_file()) files.push_back(e.path());
  if (ec || files.empty()) {
    std::fprintf(stderr, "no corpus files in %s: %s\n", argv[1], ec ? ec.message().c_str() : "empty directory");
    return 1;
  }
  std::mt19937_64 rng(4791);
  size_t runs = 0;
  for (const auto& path : files) {
    std::ifstream f(path, std::ios::binary);
    std::vector<uint8_t> seed((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    for (size_t n = 0; n <= seed.size(); ++n) {
      // A fresh allocation of exactly n bytes, so an overread is visible to ASan.
      std::vector<uint8_t> cut(seed.begin(), seed.begin() + n);
      LLVMFuzzerTestOneInput(cut.data(), cut.size());
      ++runs;
    }
    for (int i = 0; i < 300 && !seed.empty(); ++i) {
      std::vector<uint8_t> m = seed;
      int edits = 1 + static_cast<int>(rng() % 3);
      for (int k = 0; k < edits; ++k) {
        size_t at = rng() % m.size();
        if (rng() & 1)
          m[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
        else
          m[at] = static_cast<uint8_t>(rng());
      }
      LLVMFuzzerTestOneInput(m.data(), m.size());
      ++runs;
    }
  }
  std::printf("replayed %zu seeds, %zu inputs, no property violated\n", files.size(), runs);
  return 0;
}
