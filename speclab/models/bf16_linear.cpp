// speclab's CPU kernel: bf16 products and whole Llama layers for batch-1 decoding, on every x86 CPU
// with AVX2 (one source, built once per instruction set; speclab/models/kernels.py picks the path).
//
// Why: batch-1 decoding reads every weight once per token, so it runs at the speed weights stream
// from memory. oneDNN's bf16 F.linear reads a one-row product's weight at about half the rate a
// plain streaming read reaches, and on CPUs without AVX512-BF16 it converts whole blocks to fp32
// first, so a verify of 6 rows costs about 3 one-row forwards there. This kernel streams a pre-packed
// weight once per call and applies it to all T input rows (T = 1 for `ar`, a handful for a verify),
// so a verify of a few tokens costs little more than one token.
//
// Layout: W (N, K) is packed once into (N/64, K/2, 64, 2): for each block of 64 output rows, the
// pairs (k, k+1) of all 64 rows side by side. One VDPBF16PS then adds w[n, k] x[k] + w[n, k+1]
// x[k+1] to 16 fp32 lanes = 16 output rows, with x's pair broadcast: no horizontal sums, and each
// block is one sequential stream. Without AVX512-BF16 the same 64 bytes hold 16 rows' pairs: a shift
// and a mask widen them to two fp32 vectors, and two FMAs do VDPBF16PS's work.
//
// Numerics: every output is one fp32 sum over k pairs in a fixed order, rounded once to bf16
// (round to nearest even). A row's result therefore does not depend on how many rows are in the
// call, which is what makes a multi-token verify agree with one-token forwards.
//
// Instruction sets (the macro each build defines; kernels.py builds one module per path):
//   avx512bf16  -mavx512f -mavx512bw -mavx512bf16   VDPBF16PS; AMX tiles where the CPU has them
//   avx512      -mavx512f -mavx512bw                 two FMAs a pair, VCVTNEPS2BF16's rounding in integers
//   avx2        -mavx2 -mfma                         the same on two 8-lane halves
// Every path computes the same arithmetic in the same order (one 16-lane vector type, F16, whose
// sums across lanes and roundings are spelled out below), so the three give the same bits: a trace
// recorded on one CPU replays bit for bit on another (tests/test_kernels.py checks the paths
// against each other on a CPU that runs several). AMX sums in its own order (see blocks_amx).
// A NEON path for ARM is one more F16 section and one more row in kernels.py's ISAS.
#include <ATen/core/Tensor.h>   // the light headers, not torch/extension.h: a third of the build time
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>
#include <chrono>
#include <climits>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#if defined(__AVX512BF16__)
#define ISA_NAME "avx512bf16"
#define HAS_DPBF16 1           // VDPBF16PS, VCVTNEPS2BF16, and AMX (by target attributes) where granted
#elif defined(__AVX512F__)
#define ISA_NAME "avx512"
#elif defined(__AVX2__) && defined(__FMA__)
#define ISA_NAME "avx2"
#else
#error "speclab's kernel needs AVX2 and FMA at least: build with -mavx2 -mfma (or -mavx512f -mavx512bw)"
#endif

constexpr int64_t B = 64;      // output rows per packed block: 4 vectors of 16 fp32 lanes
#ifdef __AVX512F__
constexpr int TMAX = 6;        // input rows per pass: 4 x TMAX accumulators stay in 32 registers
#else
#ifndef AVX2_TMAX
#define AVX2_TMAX 3
#endif
// AVX2: rows in passes of 3 (2 passes for a 6-row verify): 3 rows x 4 groups of 8 outputs keep 12
// sums in 16 registers, and the FMAs of a pass hide each other's latency (docs/performance.md)
constexpr int TMAX = AVX2_TMAX;
#endif
#ifndef PREFETCH
#define PREFETCH 4096          // bytes ahead of the weight stream
#endif

using bf16 = at::BFloat16;

static inline float f32(bf16 v) { return static_cast<float>(v); }

// ---------------------------------------------------------------------------------------------
// F16: 16 fp32 lanes. One __m512 with AVX-512, two __m256 halves with AVX2. Lane-wise operations are
// IEEE and the same on both; the two that are not lane-wise (a sum and a max across lanes) are
// written out as one tree, _mm512_reduce_add_ps's in GCC: halves of 8, then of 4, then (0+2) + (1+3).
#ifdef __AVX512F__
struct F16 { __m512 v; };
static inline F16 fzero() { return {_mm512_setzero_ps()}; }
static inline F16 fset(float a) { return {_mm512_set1_ps(a)}; }
static inline F16 fload(const float* p) { return {_mm512_loadu_ps(p)}; }
static inline void fstore(float* p, F16 a) { _mm512_storeu_ps(p, a.v); }
static inline F16 operator+(F16 a, F16 b) { return {_mm512_add_ps(a.v, b.v)}; }
static inline F16 operator-(F16 a, F16 b) { return {_mm512_sub_ps(a.v, b.v)}; }
static inline F16 operator*(F16 a, F16 b) { return {_mm512_mul_ps(a.v, b.v)}; }
static inline F16 operator/(F16 a, F16 b) { return {_mm512_div_ps(a.v, b.v)}; }
static inline F16 vmax(F16 a, F16 b) { return {_mm512_max_ps(a.v, b.v)}; }
static inline F16 vmin(F16 a, F16 b) { return {_mm512_min_ps(a.v, b.v)}; }
static inline F16 mul_add(F16 a, F16 b, F16 c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }   // a b + c
static inline F16 neg_mul_add(F16 a, F16 b, F16 c) { return {_mm512_fnmadd_ps(a.v, b.v, c.v)}; }  // c - a b
static inline F16 round_even(F16 a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
static inline F16 times_2_to(F16 p, F16 n) { return {_mm512_scalef_ps(p.v, n.v)}; }        // p 2^n, one rounding
static inline __mmask16 first(int64_t n) { return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }
static inline F16 load_first(const float* p, int64_t n, float fill) { return {_mm512_mask_loadu_ps(_mm512_set1_ps(fill), first(n), p)}; }
static inline void store_first(float* p, int64_t n, F16 a) { _mm512_mask_storeu_ps(p, first(n), a.v); }
static inline F16 keep_first(F16 a, int64_t n) { return {_mm512_maskz_mov_ps(first(n), a.v)}; }
static inline __m256 halves_add(F16 a) {
  return _mm256_add_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1)), _mm512_castps512_ps256(a.v));
}
static inline __m256 halves_max(F16 a) {
  return _mm256_max_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1)), _mm512_castps512_ps256(a.v));
}
// 16 bf16 bit patterns -> 16 fp32 (exact: a bf16 is the top half of an fp32)
static inline F16 widen16(__m256i v) { return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16))}; }
static inline F16 load16(const bf16* p) { return widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
#ifdef HAS_DPBF16
static inline __m256i narrow16(F16 v) { return (__m256i)_mm512_cvtneps_pbh(v.v); }
#else
// VCVTNEPS2BF16 in integers: round to nearest even; zero and denormal inputs -> a signed zero (the
// instruction treats denormals as zero); NaN -> the same NaN, quiet
static inline __m256i narrow16(F16 v) {
  const __m512i u = _mm512_castps_si512(v.v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 tiny = _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7F800000)), _mm512_setzero_si512());
  r = _mm512_mask_mov_epi32(r, tiny, _mm512_srli_epi32(_mm512_and_si512(u, _mm512_set1_epi32((int)0x80000000u)), 16));
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}
#endif
// the 64 bytes of 16 rows' (k, k+1) pairs at w -> w[., k] and w[., k+1] as fp32
struct Pair { F16 even, odd; };
static inline Pair widen_pairs(const bf16* w) {
  const __m512i r = _mm512_loadu_si512(w);
  return {{_mm512_castsi512_ps(_mm512_slli_epi32(r, 16))},
          {_mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32((int)0xFFFF0000u)))}};
}
#else   // AVX2: F16 as two halves, lanes 0-7 and 8-15
struct F16 { __m256 lo, hi; };
static inline F16 fzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
static inline F16 fset(float a) { return {_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
static inline F16 fload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
static inline void fstore(float* p, F16 a) { _mm256_storeu_ps(p, a.lo); _mm256_storeu_ps(p + 8, a.hi); }
static inline F16 operator+(F16 a, F16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
static inline F16 operator-(F16 a, F16 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
static inline F16 operator*(F16 a, F16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
static inline F16 operator/(F16 a, F16 b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
static inline F16 vmax(F16 a, F16 b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
static inline F16 vmin(F16 a, F16 b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
static inline F16 mul_add(F16 a, F16 b, F16 c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
static inline F16 neg_mul_add(F16 a, F16 b, F16 c) { return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)}; }
static inline F16 round_even(F16 a) {
  constexpr int m = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(a.lo, m), _mm256_round_ps(a.hi, m)};
}
// p 2^n for integral n, as VSCALEFPS: 2^n is not always a float (n reaches 300 here), so two powers
// of two: p (in [0.5, 2) here) times 2^k1, k1 = n clamped to [-125, 127], is exact and normal, and
// times 2^(n - k1) rounds once. n is clamped to [-251, 254] first: past those the result is 0 or inf
// either way.
static inline __m256 scale8(__m256 p, __m256 n) {
  const __m256i k = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(n, _mm256_set1_ps(-251.f)), _mm256_set1_ps(254.f)));
  const __m256i k1 = _mm256_min_epi32(_mm256_max_epi32(k, _mm256_set1_epi32(-125)), _mm256_set1_epi32(127));
  const __m256i k2 = _mm256_sub_epi32(k, k1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 f1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23));
  const __m256 f2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, f1), f2);
}
static inline F16 times_2_to(F16 p, F16 n) { return {scale8(p.lo, n.lo), scale8(p.hi, n.hi)}; }
static inline __m256i first8(int64_t n) {           // lanes i < n all ones
  const int64_t c = std::max<int64_t>(-1, std::min<int64_t>(n, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline F16 load_first(const float* p, int64_t n, float fill) {
  const __m256i a = first8(n), b = first8(n - 8);
  const __m256 f = _mm256_set1_ps(fill);
  return {_mm256_blendv_ps(f, _mm256_maskload_ps(p, a), _mm256_castsi256_ps(a)),
          _mm256_blendv_ps(f, _mm256_maskload_ps(p + 8, b), _mm256_castsi256_ps(b))};
}
static inline void store_first(float* p, int64_t n, F16 a) {
  _mm256_maskstore_ps(p, first8(n), a.lo);
  _mm256_maskstore_ps(p + 8, first8(n - 8), a.hi);
}
static inline F16 keep_first(F16 a, int64_t n) {
  return {_mm256_and_ps(a.lo, _mm256_castsi256_ps(first8(n))), _mm256_and_ps(a.hi, _mm256_castsi256_ps(first8(n - 8)))};
}
static inline __m256 halves_add(F16 a) { return _mm256_add_ps(a.hi, a.lo); }
static inline __m256 halves_max(F16 a) { return _mm256_max_ps(a.hi, a.lo); }
static inline __m256 widen8(__m128i v) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16)); }
static inline F16 widen16(__m256i v) { return {widen8(_mm256_castsi256_si128(v)), widen8(_mm256_extracti128_si256(v, 1))}; }
static inline F16 load16(const bf16* p) { return widen16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
// VCVTNEPS2BF16 in integers, 8 lanes (see the AVX-512 narrow16): 8 results in the low 16 bits of each lane
static inline __m256i narrow8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
  const __m256i tiny = _mm256_cmpeq_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7F800000)), _mm256_setzero_si256());
  const __m256i zero = _mm256_srli_epi32(_mm256_and_si256(u, _mm256_set1_epi32((int)0x80000000u)), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(_mm256_blendv_epi8(r, zero, tiny), quiet, nan);
}
static inline __m256i narrow16(F16 v) {             // 16 bf16 in order (packus interleaves 128-bit lanes)
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(narrow8(v.lo), narrow8(v.hi)), 0xD8);
}
struct Pair { F16 even, odd; };
static inline Pair widen_pairs(const bf16* w) {
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16));
  const __m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
  return {{_mm256_castsi256_ps(_mm256_slli_epi32(a, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(b, 16))},
          {_mm256_castsi256_ps(_mm256_and_si256(a, hi)), _mm256_castsi256_ps(_mm256_and_si256(b, hi))}};
}
#endif

// the sum and the max across 16 lanes, one tree on every path: 8 + 8, 4 + 4, then (0 + 2) + (1 + 3)
static inline float hsum(F16 a) {
  const __m256 h = halves_add(a);
  const __m128 q = _mm_add_ps(_mm256_extractf128_ps(h, 1), _mm256_castps256_ps128(h));
  const __m128 r = _mm_add_ps(q, _mm_shuffle_ps(q, q, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(r) + _mm_cvtss_f32(_mm_shuffle_ps(r, r, _MM_SHUFFLE(1, 1, 1, 1)));
}
static inline float hmax(F16 a) {
  const __m256 h = halves_max(a);
  const __m128 q = _mm_max_ps(_mm256_extractf128_ps(h, 1), _mm256_castps256_ps128(h));
  const __m128 r = _mm_max_ps(q, _mm_shuffle_ps(q, q, _MM_SHUFFLE(1, 0, 3, 2)));
  return _mm_cvtss_f32(_mm_max_ps(r, _mm_shuffle_ps(r, r, _MM_SHUFFLE(0, 1, 0, 1))));
}

// 16 fp32 -> 16 bf16, rounded to nearest even as torch rounds
static inline void store16(bf16* p, F16 v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), narrow16(v)); }

// fp32 -> bf16 -> fp32: the rounding torch applies between two bf16 ops
static inline F16 round16(F16 v) { return widen16(narrow16(v)); }

at::Tensor pack(at::Tensor W) {
  TORCH_CHECK(W.dim() == 2 && W.scalar_type() == at::kBFloat16, "pack: W must be a 2-D bf16 tensor");
  const int64_t N = W.size(0), K = W.size(1);
  TORCH_CHECK(N % B == 0 && K % 2 == 0, "pack: rows must be a multiple of 64 and columns even");
  return W.contiguous().view({N / B, B, K / 2, 2}).permute({0, 2, 1, 3}).contiguous();
}

std::string isa() { return ISA_NAME; }

// ---------------------------------------------------------------------------------------------
// The products. A block is read in chunks of CHUNK k-pairs; each pass over a chunk (a pass of
// rows, with AVX2 a pass of output groups) keeps its sums in registers and leaves them in `part`.

// What a pass prefetches: lines [from, to) of 64 bytes from base (the next chunk), `per` a k-pair.
// Every pass over a chunk takes its share of the next chunk's lines, so the memory stays busy while
// the passes that read from L1 run (were it the first pass alone, memory would idle through the others).
// measurement knobs (-D at build time, as CHUNK_PAIRS and PREFETCH): the prefetch's cache level, or
// none at all (NO_FETCH). L2 (_MM_HINT_T1) measured no faster than L1 on the Xeon VM, and no
// prefetch made a 6-row AVX2 verify 1.72 -> 2.11 one-row forwards.
#ifndef FETCH_HINT
#define FETCH_HINT _MM_HINT_T0
#endif
struct Fetch {
  const char* base;
  int64_t from, to, per;
  inline void at(int64_t i) const {
#ifndef NO_FETCH
    for (int64_t l = from + i * per, e = std::min(to, l + per); l < e; ++l) _mm_prefetch(base + 64 * l, FETCH_HINT);
#endif
  }
};

#ifdef HAS_DPBF16
// One pass over k-pairs [k2a, k2b) of a 64-row block for TT rows of x (bf16, (TT, K)) and the G
// groups of 16 outputs from g0, with VDPBF16PS: the running sums in part (TT, 64) fp32, started at
// zero when `start` (storing and reloading an fp32 sum is exact, so a pass may stop anywhere).
template <int TT, int G>
static inline void dp_pass(const bf16* x, int64_t K, const bf16* Wb, int64_t k2a, int64_t k2b, int g0,
                           float* part, bool start, const Fetch& fetch) {
  __m512 acc[TT][G];
#pragma GCC unroll 8
  for (int t = 0; t < TT; ++t)
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) acc[t][g] = start ? _mm512_setzero_ps() : _mm512_loadu_ps(part + t * B + 16 * (g0 + g));
  const int32_t* xp = reinterpret_cast<const int32_t*>(x);     // x's bf16 pairs read as one 32-bit word each
  for (int64_t k2 = k2a; k2 < k2b; ++k2) {
    const bf16* w = Wb + k2 * 2 * B + 32 * g0;
    fetch.at(k2 - k2a);
    __m512i wv[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) wv[g] = _mm512_loadu_si512(w + 32 * g);
#pragma GCC unroll 8
    for (int t = 0; t < TT; ++t) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(xp[t * K / 2 + k2]);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) acc[t][g] = _mm512_dpbf16_ps(acc[t][g], (__m512bh)wv[g], xb);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < TT; ++t)
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) _mm512_storeu_ps(part + t * B + 16 * (g0 + g), acc[t][g]);
}
#else   // no AVX512-BF16: VDPBF16PS's arithmetic in FMAs

// VDPBF16PS adds w[n, k+1] x[k+1] to an output's fp32 sum, then w[n, k] x[k] (Intel's pseudocode:
// the odd element first), each product exact in fp32 and each add rounded to nearest even, with
// denormals read as zero and results flushed to zero. Here each pair is widened to two fp32 vectors
// (widen_pairs: a shift and a mask) and added by FMA(odd), then FMA(even): an FMA of an exact
// product is that add. MXCSR's DAZ and FTZ bits, set for the product, do the flushing. So the sums
// are VDPBF16PS's, bit for bit.
struct FlushDenormals {
  unsigned int csr;
  FlushDenormals() : csr(_mm_getcsr()) { _mm_setcsr(csr | 0x8040); }   // FTZ | DAZ
  ~FlushDenormals() { _mm_setcsr(csr); }
};

// One pass over k-pairs [k2a, k2b) of a 64-row block for TT rows of x (widened to fp32, xw (TT, K))
// and the G groups of 16 outputs from g0: the running sums in part (TT, 64) fp32, started at zero
// when `start` (storing and reloading an fp32 sum is exact, so a pass may stop anywhere).
#ifdef __AVX512F__
template <int TT, int G>
static inline void fma_pass(const float* xw, int64_t K, const bf16* Wb, int64_t k2a, int64_t k2b, int g0,
                            float* part, bool start, const Fetch& fetch) {
  F16 acc[TT][G];
#pragma GCC unroll 8
  for (int t = 0; t < TT; ++t)
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) acc[t][g] = start ? fzero() : fload(part + t * B + 16 * (g0 + g));
  for (int64_t k2 = k2a; k2 < k2b; ++k2) {
    const bf16* w = Wb + k2 * 2 * B;
    fetch.at(k2 - k2a);
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const Pair p = widen_pairs(w + 32 * (g0 + g));
#pragma GCC unroll 8
      for (int t = 0; t < TT; ++t) {
        acc[t][g] = mul_add(p.odd, fset(xw[t * K + 2 * k2 + 1]), acc[t][g]);
        acc[t][g] = mul_add(p.even, fset(xw[t * K + 2 * k2]), acc[t][g]);
      }
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < TT; ++t)
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) fstore(part + t * B + 16 * (g0 + g), acc[t][g]);
}
#endif

#ifndef __AVX512F__
#if !defined(AVX2_NO_ASM)
// A 3-row x 4-group pass's k-pair (its 24 FMAs) with the 12 sums pinned to registers: the
// clobbers leave the compiler ymm0-11 for them. Its own allocation of the loop spilled 4 of the
// 12 to the stack, and their store-to-load round trips then sat in those sums' chains: 48 of the
// 66 GMAC/s a Zen 5 core's 256-bit FMAs do at 48 rows, 64 with this (scripts/kernel_products.py).
// The same FMAs in the same order, so the same bits (AVX2_NO_ASM: the plain loop, for comparing).
#define AVX2_GROUP(at, mask, g) \
  "vmovdqu " #at "(%[w]), %%ymm15\n\t" "vpshufb %[" #mask "], %%ymm15, %%ymm15\n\t" \
  "vfmadd231ps %%ymm15, %%ymm12, %[a0" #g "]\n\t" "vfmadd231ps %%ymm15, %%ymm13, %[a1" #g "]\n\t" \
  "vfmadd231ps %%ymm15, %%ymm14, %[a2" #g "]\n\t"
#define AVX2_HALF(off, mask) \
  "vbroadcastss " #off "(%[x0]), %%ymm12\n\t" "vbroadcastss " #off "(%[x1]), %%ymm13\n\t" \
  "vbroadcastss " #off "(%[x2]), %%ymm14\n\t" \
  AVX2_GROUP(0, mask, 0) AVX2_GROUP(32, mask, 1) AVX2_GROUP(64, mask, 2) AVX2_GROUP(96, mask, 3)
// a: the sums; x: row 0's pair (rows K apart); w: the 4 groups' pair vectors; odd / even: the shuffles
static inline void pair_3x4(__m256 (&a)[3][4], const float* x, int64_t K, const __m256i* w, const __m256i& odd,
                            const __m256i& even) {
  asm(AVX2_HALF(4, odd) AVX2_HALF(0, even)      // VDPBF16PS's order: the odd element, then the even
      : [a00] "+x"(a[0][0]), [a01] "+x"(a[0][1]), [a02] "+x"(a[0][2]), [a03] "+x"(a[0][3]),
        [a10] "+x"(a[1][0]), [a11] "+x"(a[1][1]), [a12] "+x"(a[1][2]), [a13] "+x"(a[1][3]),
        [a20] "+x"(a[2][0]), [a21] "+x"(a[2][1]), [a22] "+x"(a[2][2]), [a23] "+x"(a[2][3])
      : [x0] "r"(x), [x1] "r"(x + K), [x2] "r"(x + 2 * K), [w] "r"(w), [odd] "m"(odd), [even] "m"(even)
      : "xmm12", "xmm13", "xmm14", "xmm15");
}
#undef AVX2_HALF
#undef AVX2_GROUP
#endif

// AVX2: groups of 8 outputs (one __m256 of sums each), G8 of them per pass. A sum waits on its two
// FMAs a pair (odd, then even: VDPBF16PS's order), so the FMA units need about 10 independent sums
// in flight: TT x G8 of them, in 16 registers with the pair's two weight vectors and a broadcast.
template <int TT, int G8>
static inline void fma_pass8(const float* xw, int64_t K, const bf16* Wb, int64_t k2a, int64_t k2b, int j0,
                             float* part, bool start, const Fetch& fetch) {
  __m256 acc[TT][G8];
#pragma GCC unroll 8
  for (int t = 0; t < TT; ++t)
#pragma GCC unroll 8
    for (int j = 0; j < G8; ++j) acc[t][j] = start ? _mm256_setzero_ps() : _mm256_loadu_ps(part + t * B + 8 * (j0 + j));
  // The pair's two halves by byte shuffles: port 5 on Intel cores, where a shift and an AND would
  // take turns with the FMAs on ports 0 and 1 (llvm-mca, Skylake-X: 13.6 -> 15.8 of the 16
  // multiply-adds a cycle two 256-bit FMA units do, 3 rows x 4 groups). The same bits as the shift;
  // measured on a Xeon VM, no different (within 4% at 1-8 rows: BENCHMARKS.md, "Kernel paths").
  const __m256i even_c = _mm256_setr_epi8(-128, -128, 0, 1, -128, -128, 4, 5, -128, -128, 8, 9, -128, -128, 12, 13,
                                          -128, -128, 0, 1, -128, -128, 4, 5, -128, -128, 8, 9, -128, -128, 12, 13);
  const __m256i odd_c = _mm256_setr_epi8(-128, -128, 2, 3, -128, -128, 6, 7, -128, -128, 10, 11, -128, -128, 14, 15,
                                         -128, -128, 2, 3, -128, -128, 6, 7, -128, -128, 10, 11, -128, -128, 14, 15);
  for (int64_t k2 = k2a; k2 < k2b; ++k2) {
    const __m256i* w = reinterpret_cast<const __m256i*>(Wb + k2 * 2 * B) + j0;
    fetch.at(k2 - k2a);
#if !defined(AVX2_NO_ASM)
    if constexpr (TT == 3 && G8 == 4) {
      pair_3x4(acc, xw + 2 * k2, K, w, odd_c, even_c);
      continue;
    }
#endif
#pragma GCC unroll 8
    for (int j = 0; j < G8; ++j) {
      const __m256i r = _mm256_loadu_si256(w + j);
      const __m256 we = _mm256_castsi256_ps(_mm256_shuffle_epi8(r, even_c));
      const __m256 wo = _mm256_castsi256_ps(_mm256_shuffle_epi8(r, odd_c));
#pragma GCC unroll 8
      for (int t = 0; t < TT; ++t) {
        acc[t][j] = _mm256_fmadd_ps(wo, _mm256_broadcast_ss(xw + t * K + 2 * k2 + 1), acc[t][j]);
        acc[t][j] = _mm256_fmadd_ps(we, _mm256_broadcast_ss(xw + t * K + 2 * k2), acc[t][j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < TT; ++t)
#pragma GCC unroll 8
    for (int j = 0; j < G8; ++j) _mm256_storeu_ps(part + t * B + 8 * (j0 + j), acc[t][j]);
}
#endif

#endif

// How many passes over a chunk a pass of TT rows takes (its groups of outputs a pass).
#ifdef __AVX512F__
template <int TT> constexpr int group_passes() { return 1; }
#else
template <int TT> constexpr int groups8() { return TT == 1 ? 8 : TT <= 3 ? 4 : 2; }   // <= 12 sums
template <int TT> constexpr int group_passes() { return 8 / groups8<TT>(); }
#endif

// One chunk for TT rows: the groups of 16 [j0, j0 + nj) of a block (all 4, or a half: nj = 2) in
// one pass with AVX-512 (4 x TMAX sums in 32 registers); with AVX2, groups8 groups of 8 (of a
// block's 8) a pass, fewer as the rows grow, a half's 4 in one. Pass p0 + i (of P over this chunk)
// prefetches its share of the next chunk (next, L lines). X: x's rows as bf16 (VDPBF16PS reads the
// pairs) or widened to fp32 (the FMA paths).
template <int TT, class X>
static inline void rows_pass(const X* xt, int64_t K, const bf16* Wb, int64_t k2a, int64_t k2b, float* part,
                             bool start, int j0, int nj, const char* next, int64_t L, int64_t p0, int64_t P) {
  // one pass a chunk: the lines PREFETCH bytes ahead of the stream, 4 a pair
  if (P == 1) next = reinterpret_cast<const char*>(Wb + k2a * 2 * B) + PREFETCH, L = 4 * (k2b - k2a);
  const int64_t share = (L + P - 1) / P, n = k2b - k2a, per = (share + n - 1) / n;
  auto fetch = [&](int64_t p) { return Fetch{next, p * share, std::min(L, (p + 1) * share), per}; };
#if defined(HAS_DPBF16)
  if (nj == 4) dp_pass<TT, 4>(xt, K, Wb, k2a, k2b, 0, part, start, fetch(p0));
  else dp_pass<TT, 2>(xt, K, Wb, k2a, k2b, j0, part, start, fetch(p0));
#elif defined(__AVX512F__)
  if (nj == 4) fma_pass<TT, 4>(xt, K, Wb, k2a, k2b, 0, part, start, fetch(p0));
  else fma_pass<TT, 2>(xt, K, Wb, k2a, k2b, j0, part, start, fetch(p0));
#else
  if (nj == 4) {
    constexpr int G8 = groups8<TT>();
    for (int g = 0, p = (int)p0; g < 8; g += G8, ++p) fma_pass8<TT, G8>(xt, K, Wb, k2a, k2b, g, part, start, fetch(p));
  } else {
    fma_pass8<TT, 4>(xt, K, Wb, k2a, k2b, 2 * j0, part, start, fetch(p0));
  }
#endif
}

// A block is read in chunks of CHUNK k-pairs (16 KB): every pass over a chunk after the first (the
// other rows, the other groups) reads it from L1, and memory sees one sequential stream.
#ifndef CHUNK_PAIRS
#define CHUNK_PAIRS 64
#endif
constexpr int64_t CHUNK = CHUNK_PAIRS;

// y[:, 16 g0 : 16 g1] for the groups [g0, g1) of 16 outputs (g0, g1 even: whole blocks of 64 and
// halves of 32, which cols() shares out so that two threads split SmolLM2's 9-block matrices 4.5 /
// 4.5, not 5 / 4). A half's outputs get the same sums, in the same order, as a whole block's.
static void blocks_loop(const bf16* x, int64_t T, int64_t K, const bf16* wp, int64_t K2, int64_t g0,
                        int64_t g1, bf16* y, int64_t N) {
  if (g0 >= g1) return;                        // more threads than halves: nothing for this one
  thread_local std::vector<float> part;
  if ((int64_t)part.size() < T * B) part.resize(T * B);
#ifdef HAS_DPBF16
  const bf16* xs = x;                          // VDPBF16PS reads x's bf16 pairs as they are
#else
  thread_local std::vector<float> xw;          // the FMA paths: x widened to fp32 once a call
  if ((int64_t)xw.size() < T * K) xw.resize(T * K);
  int64_t i = 0;
  for (; i + 16 <= T * K; i += 16) fstore(xw.data() + i, load16(x + i));
  for (; i < T * K; ++i) xw[i] = f32(x[i]);
  const float* xs = xw.data();
  const FlushDenormals ftz;
#endif
  // rows in passes of at most TMAX, balanced (8 rows: 4 + 4, not 6 + 2: a pass of few rows
  // leaves the dot-product units waiting on too few sums)
  const int64_t passes = (T + TMAX - 1) / TMAX, per = (T + passes - 1) / passes;
  auto gp = [](int64_t rows) -> int64_t {
    switch (rows) {
      case 6: return group_passes<6>(); case 5: return group_passes<5>(); case 4: return group_passes<4>();
      case 3: return group_passes<3>(); case 2: return group_passes<2>(); default: return group_passes<1>();
    }
  };
  // passes over a chunk: row passes x group passes of a whole block; a half takes one a row pass
  int64_t P_whole = 0;
  for (int64_t t0 = 0; t0 < T; t0 += per) P_whole += gp(std::min<int64_t>(per, T - t0));
  // this call's groups of 16 in block b: [j0, j1), all 4 or a half
  auto mine = [&](int64_t b) {
    return std::pair<int, int>{(int)std::max<int64_t>(g0 - 4 * b, 0), (int)std::min<int64_t>(g1 - 4 * b, 4)};
  };
  for (int64_t b = g0 / 4; 4 * b < g1; ++b) {
    const bf16* Wb = wp + b * K2 * 2 * B;
    const auto [j0, j1] = mine(b);
    const int nj = j1 - j0;
    const int64_t P = nj == 4 ? P_whole : passes;
    for (int64_t k2a = 0; k2a < K2; k2a += CHUNK) {
      const int64_t k2b = std::min(K2, k2a + CHUNK);
      // the next chunk: this block's, or the next block's first (blocks lie back to back); all
      // its lines, a half's neighbour's too (halves are a prompt's rows, bound by arithmetic)
      const char* next = reinterpret_cast<const char*>(Wb + k2b * 2 * B);
      const int64_t L = (k2b < K2 ? std::min(CHUNK, K2 - k2b) : 4 * (b + 1) < g1 ? std::min(CHUNK, K2) : 0) * 4;
      int64_t p0 = 0;
      for (int64_t t0 = 0; t0 < T; t0 += per) {
        const auto* xt = xs + t0 * K;
        float* pt = part.data() + t0 * B;
        const int64_t rows = std::min<int64_t>(per, T - t0);
        const bool start = k2a == 0;
        switch (rows) {
          case 6: rows_pass<6>(xt, K, Wb, k2a, k2b, pt, start, j0, nj, next, L, p0, P); break;
          case 5: rows_pass<5>(xt, K, Wb, k2a, k2b, pt, start, j0, nj, next, L, p0, P); break;
          case 4: rows_pass<4>(xt, K, Wb, k2a, k2b, pt, start, j0, nj, next, L, p0, P); break;
          case 3: rows_pass<3>(xt, K, Wb, k2a, k2b, pt, start, j0, nj, next, L, p0, P); break;
          case 2: rows_pass<2>(xt, K, Wb, k2a, k2b, pt, start, j0, nj, next, L, p0, P); break;
          default: rows_pass<1>(xt, K, Wb, k2a, k2b, pt, start, j0, nj, next, L, p0, P);
        }
        p0 += nj == 4 ? gp(rows) : 1;
      }
    }
    for (int64_t t = 0; t < T; ++t)
      for (int g = j0; g < j1; ++g) store16(y + t * N + b * B + 16 * g, fload(part.data() + t * B + 16 * g));
  }
}

#ifdef HAS_DPBF16
// ---------------------------------------------------------------------------------------------
// The same product on AMX (Sapphire Rapids and later), where the CPU has it and the OS grants it.
//
// Why: the loop above is bound by its dot-product instructions from 2 rows on, so its cost grows
// with the rows (docs/performance.md). One TDPBF16PS multiplies a (rows <= 16, 32) tile of x by a (32, 16) tile of W in 16
// cycles whatever the number of rows, so up to 16 rows cost what one row costs: the weight's stream.
//
// The packed layout is already AMX's: the 16 k-pairs x 16 rows x 2 of a B tile are rows of 64 bytes
// at a stride of 256 (one k-pair of a 64-row block). Numerics: each output is the tile unit's fp32
// sum over k (its own order and rounding, not the loop above's), rounded once to bf16. A row's result
// depends only on that row of x, so a verify still agrees bit for bit with one-token forwards; the
// choice between the two loops depends on the machine and on K only, never on the number of rows.
static bool amx_on = false;

bool use_amx(bool on) {
  amx_on = false;
  if (on) {                                  // Linux: ask once for the tile state (else SIGILL)
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    amx_on = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
  }
  return amx_on;
}

// a product with K inputs runs on the tiles (a tile row holds 32 of K), else in the AVX-512 loop
static inline bool on_tiles(int64_t K) { return amx_on && K % 32 == 0; }

struct TileConfig {                          // the LDTILECFG memory layout (palette 1)
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// GCC 12's _tile_loadconfig and _tile_loadd tell the compiler they read 8 bytes and nothing, so it
// may drop or delay the stores that fill a config or a tile's source (it dropped a config's rows
// and columns here): both as asm that reads memory.
#define TILE_CONFIG(cfg) __asm__ volatile("ldtilecfg %0" :: "m"(cfg) : "memory")
#define TILE_LOAD(dst, base, stride) \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #dst :: "r"((const void*)(base)), "r"((long)(stride)) : "memory")

// Work is shared out in columns of 16 outputs (one tile's), not blocks of 64: SmolLM2's 576-wide
// matrices are 9 blocks, which two threads split 5 / 4, leaving one thread idle at the barrier for a
// ninth of every product; in columns they split 18 / 18. A column's arithmetic is the same
// whichever thread computes it.
__attribute__((target("amx-tile,amx-bf16,avx512f,avx512bf16")))
static void blocks_amx(const at::BFloat16* x, int64_t T, int64_t K, const at::BFloat16* wp, int64_t K2,
                       int64_t g0, int64_t g1, at::BFloat16* y, int64_t N) {
  alignas(64) float c[16 * B];               // one block's outputs for up to 16 rows
  int configured = 0;                        // the rows the tiles are configured for
  for (int64_t b = g0 / 4; b * 4 < g1; ++b) {
    const at::BFloat16* Wb = wp + b * K2 * 2 * B;
    const int j0 = (int)std::max<int64_t>(g0 - 4 * b, 0), j1 = (int)std::min<int64_t>(g1 - 4 * b, 4);
    // passes of 16 rows inside the block: a second pass reads the block from cache, not memory
    for (int64_t t0 = 0; t0 < T; t0 += 16) {
      const int R = (int)std::min<int64_t>(16, T - t0);
      if (R != configured) {
        TileConfig cfg;
        for (int i = 0; i < 5; ++i) cfg.rows[i] = R, cfg.colsb[i] = 64;   // tiles 0-3: C (R, 16) fp32; 4: A (R, 32) bf16
        for (int i = 5; i < 7; ++i) cfg.rows[i] = 16, cfg.colsb[i] = 64;  // tiles 5, 6: B, 16 k-pairs x 16 columns
        TILE_CONFIG(cfg);
        configured = R;
      }
      const at::BFloat16* xt = x + t0 * K;
      _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
      for (int64_t kc = 0; kc < K / 32; ++kc) {
        const at::BFloat16* w = Wb + kc * 16 * 2 * B;                  // 16 k-pairs of 64 rows: 4 KB
        const char* ahead = reinterpret_cast<const char*>(w) + PREFETCH;
        for (int i = 0; i < 4096; i += 256)      // this thread's columns: 64 bytes of each 256
          for (int j = j0; j < j1; ++j) _mm_prefetch(ahead + i + 64 * j, _MM_HINT_T0);
        TILE_LOAD(4, xt + kc * 32, K * 2);
        if (j0 <= 0 && 0 < j1) { TILE_LOAD(5, w, 4 * B); _tile_dpbf16ps(0, 4, 5); }
        if (j0 <= 1 && 1 < j1) { TILE_LOAD(6, w + 32, 4 * B); _tile_dpbf16ps(1, 4, 6); }
        if (j0 <= 2 && 2 < j1) { TILE_LOAD(5, w + 64, 4 * B); _tile_dpbf16ps(2, 4, 5); }
        if (j0 <= 3 && 3 < j1) { TILE_LOAD(6, w + 96, 4 * B); _tile_dpbf16ps(3, 4, 6); }
      }
      _tile_stored(0, c, 4 * B); _tile_stored(1, c + 16, 4 * B);
      _tile_stored(2, c + 32, 4 * B); _tile_stored(3, c + 48, 4 * B);
      for (int r = 0; r < R; ++r)
        for (int g = j0; g < j1; ++g)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + (t0 + r) * N + b * B + g * 16),
                              (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(c + r * B + g * 16)));
    }
  }
  _tile_release();
}
#else   // no AMX without AVX512-BF16's build
static bool amx_on = false;
bool use_amx(bool on) { return amx_on = false; }      // no tiles without AVX512-BF16's build
static inline bool on_tiles(int64_t) { return false; }
static void blocks_amx(const bf16*, int64_t, int64_t, const bf16*, int64_t, int64_t, int64_t, bf16*, int64_t) {}
#endif

// y[:, 16 g0 : 16 g1] for the columns [g0, g1) of 16 outputs of packed W: y (T, N) = x (T, K) @ W^T.
// The loops take whole blocks and halves (g0, g1 even: cols() shares them so).
static void blocks(const bf16* x, int64_t T, int64_t K, const bf16* wp, int64_t K2, int64_t g0,
                   int64_t g1, bf16* y, int64_t N) {
  if (on_tiles(K)) return blocks_amx(x, T, K, wp, K2, g0, g1, y, N);
  blocks_loop(x, T, K, wp, K2, g0, g1, y, N);
}
at::Tensor packed_linear(at::Tensor x, at::Tensor Wp) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(),
              "linear: x must be a contiguous (T, K) bf16 tensor");
  const int64_t T = x.size(0), K = x.size(1), NB = Wp.size(0), K2 = Wp.size(1), N = NB * B;
  TORCH_CHECK(K == 2 * K2, "linear: x has ", K, " columns, the packed weight ", 2 * K2);
  auto y = at::empty({T, N}, x.options());
  const auto* xp = x.data_ptr<at::BFloat16>();
  const auto* wp = Wp.data_ptr<at::BFloat16>();
  auto* yp = y.data_ptr<at::BFloat16>();
  at::parallel_for(0, NB, 1, [&](int64_t b0, int64_t b1) { blocks(xp, T, K, wp, K2, 4 * b0, 4 * b1, yp, N); });
  return y;
}

// ---------------------------------------------------------------------------------------------
// One Llama decoder layer for T rows in a single call (the lean forward's per-op Python and ATen
// overhead is ~45 small ops a layer, a third of a decode step once the matmuls are fast).
//
// Every elementwise step rounds to bf16 where the torch ops of speclab's lean forward do (RMSNorm
// as LlamaRMSNorm: fp32 statistics, rounded, times the weight; RoPE, SiLU, products and residual
// adds each rounded), and attention is fp32. Attention is computed ROW BY ROW over the keys that
// row sees, in cache order: a row's arithmetic does not depend on how many rows are in the call,
// nor on whether its keys are a contiguous prefix (a chain) or its ancestors in a draft tree. With
// the row-invariant linear above, a verify gives each position bit for bit the hidden states a
// one-token forward gives it.


// out[i] = bf16(a[i] + b[i]) for n values (a residual add)
static void add_rows(const bf16* a, const bf16* b, bf16* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) store16(out + i, load16(a + i) + load16(b + i));
  for (; i < n; ++i) out[i] = bf16(f32(a[i]) + f32(b[i]));
}

// out (T, C) = bf16(w * bf16(x * rsqrt(mean(x^2) + eps)))
static void rms_rows(const bf16* x, const bf16* w, bf16* out, int64_t T, int64_t C, float eps) {
  for (int64_t t = 0; t < T; ++t) {
    const bf16* xr = x + t * C;
    // the sum of squares in 16 lanes (one chain of C dependent adds waits on each add's latency,
    // and every thread runs 2 norms x T rows a layer), lanes summed in a fixed tree, the tail
    // after them
    F16 acc = fzero();
    int64_t c0 = 0;
    for (; c0 + 16 <= C; c0 += 16) {
      const F16 v = load16(xr + c0);
      acc = mul_add(v, v, acc);
    }
    float ss = hsum(acc);
    for (; c0 < C; ++c0) ss += f32(xr[c0]) * f32(xr[c0]);
    const float r = 1.f / std::sqrt(ss / C + eps);
    const F16 vr = fset(r);
    int64_t c = 0;
    for (; c + 16 <= C; c += 16)
      store16(out + t * C + c, load16(w + c) * round16(load16(xr + c) * vr));
    for (; c < C; ++c) out[t * C + c] = bf16(f32(w[c]) * f32(bf16(f32(xr[c]) * r)));
  }
}

at::Tensor rms_norm(at::Tensor x, at::Tensor w, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.is_contiguous() && w.is_contiguous(), "rms_norm: bf16, contiguous");
  auto out = at::empty_like(x);
  rms_rows(x.data_ptr<bf16>(), w.data_ptr<bf16>(), out.data_ptr<bf16>(), x.numel() / x.size(-1), x.size(-1), (float)eps);
  return out;
}

// x (D,) rotated: bf16(bf16(x * cos) + bf16(roll(x, D/2) * sin_signed))
static inline void rope(const bf16* x, const bf16* cs, const bf16* sn, bf16* out, int64_t D) {
  if (D % 32 == 0) {                        // 16 lanes at a time, the same roundings
    for (int64_t d = 0; d < D; d += 16)
      store16(out + d, round16(load16(x + d) * load16(cs + d)) + round16(load16(x + (d + D / 2) % D) * load16(sn + d)));
    return;
  }
  for (int64_t d = 0; d < D; ++d)
    out[d] = bf16(f32(bf16(f32(x[d]) * f32(cs[d]))) + f32(bf16(f32(x[(d + D / 2) % D]) * f32(sn[d]))));
}

// exp of 16 floats: exp(x) = 2^n exp(r), n = round(x / ln 2), |r| <= ln 2 / 2, exp(r) by its
// degree-6 Taylor polynomial (relative error ~2e-7, about 2 ulp); exp(-inf) = 0 and exp(inf) = inf
// exactly (x clamped to [-104, 104]: past those exp is 0 or inf in fp32 either way).
static inline F16 exp16(F16 x) {
  x = vmin(vmax(x, fset(-104.f)), fset(104.f));
  const F16 n = round_even(x * fset(1.44269504088896341f));
  F16 r = neg_mul_add(n, fset(0.693145751953125f), x);
  r = neg_mul_add(n, fset(1.428606765330187045e-06f), r);
  F16 p = fset(1.f / 720);
  p = mul_add(p, r, fset(1.f / 120));
  p = mul_add(p, r, fset(1.f / 24));
  p = mul_add(p, r, fset(1.f / 6));
  p = mul_add(p, r, fset(0.5f));
  p = mul_add(p, r, fset(1.f));
  p = mul_add(p, r, fset(1.f));
  return times_2_to(p, n);
}

// One row's attention for GG query heads sharing one key/value head, in two parts.
// scores: q (GG, D) fp32 against the n keys the row sees (slots keys[0..n), in cache order) of Kc
// (slot stride ss, bf16) -> p (GG, S) scaled scores: one fp32 dot per key (16-lane partial sums over
// D, then summed across lanes), each key converted to fp32 once for the GG heads.
// softmax_pv: p's scores -> weights (softmax per head) -> a (GG, D) = weights @ V, summed over the
// keys in order. The arithmetic of a row depends only on its own query and the keys it sees, never
// on the other rows of the call. NCH = D / 16.
template <int NCH, int GG>
static void scores(const float* q, const bf16* Kc, int64_t ss, const int64_t* keys, int64_t n, int64_t S,
                   float scale, float* p) {
  constexpr int D = 16 * NCH;
  F16 qh[GG][NCH];
  for (int h = 0; h < GG; ++h)
    for (int c = 0; c < NCH; ++c) qh[h][c] = fload(q + h * D + 16 * c);
  for (int64_t j = 0; j < n; ++j) {                          // scores (GG, n)
    const bf16* k = Kc + keys[j] * ss;
    F16 kf[NCH];
    for (int c = 0; c < NCH; ++c) kf[c] = load16(k + 16 * c);
    for (int h = 0; h < GG; ++h) {
      F16 acc = fzero();
      for (int c = 0; c < NCH; ++c) acc = mul_add(qh[h][c], kf[c], acc);
      p[h * S + j] = hsum(acc) * scale;
    }
  }
}

// p[0..n) scores -> exp(score - max), in place, and their sum: exp in 16-wide chunks, summed
// lane-wise then across lanes (a fixed order for n keys)
static float softmax_exp(float* ph, int64_t n) {
  // the max 16 lanes at a time (exact in any order; a scalar chain of maxes waits a dependent
  // max per key, a large share of attention)
  F16 vmx = fset(-INFINITY);
  for (int64_t j = 0; j < n; j += 16) vmx = vmax(vmx, load_first(ph + j, n - j, -INFINITY));
  const F16 vm = fset(hmax(vmx));
  F16 vs = fzero();
  for (int64_t j = 0; j < n; j += 16) {
    const F16 e = exp16(load_first(ph + j, n - j, 0.f) - vm);
    store_first(ph + j, n - j, e);
    vs = vs + keep_first(e, n - j);
  }
  return hsum(vs);
}

// p[0..n) scores -> softmax weights, in place: softmax_exp, then each divided by the sum
static void softmax_row(float* ph, int64_t n) {
  const F16 total = fset(softmax_exp(ph, n));
  for (int64_t j = 0; j < n; j += 16)          // IEEE division, 16 at a time: the scalar one's results
    store_first(ph + j, n - j, load_first(ph + j, n - j, 0.f) / total);
}

template <int NCH, int GG>
static void softmax_pv(const bf16* Vc, int64_t ss, const int64_t* keys, int64_t n, int64_t S, float* p, bf16* a) {
  constexpr int D = 16 * NCH;
  for (int h = 0; h < GG; ++h) softmax_row(p + h * S, n);
  F16 o[GG][NCH];                                            // o (GG, D) = softmax(p) @ V
  for (int h = 0; h < GG; ++h)
    for (int c = 0; c < NCH; ++c) o[h][c] = fzero();
  for (int64_t j = 0; j < n; ++j) {
    const bf16* v = Vc + keys[j] * ss;
    F16 vf[NCH];
    for (int c = 0; c < NCH; ++c) vf[c] = load16(v + 16 * c);
    for (int h = 0; h < GG; ++h) {
      const F16 pj = fset(p[h * S + j]);
      for (int c = 0; c < NCH; ++c) o[h][c] = mul_add(pj, vf[c], o[h][c]);
    }
  }
  for (int h = 0; h < GG; ++h)
    for (int c = 0; c < NCH; ++c) store16(a + h * D + 16 * c, o[h][c]);
}

// the g query heads of one key/value head, in groups of at most HEADS (their vectors stay in
// registers: 4 with AVX-512's 32, 2 with AVX2's 16); a head's arithmetic is the same in any group
#ifdef __AVX512F__
constexpr int HEADS = 4;
#else
constexpr int HEADS = 2;
#endif
template <int NCH>
static void attend_heads(const float* q, const bf16* Kc, const bf16* Vc, int64_t ss, const int64_t* keys,
                         int64_t n, int64_t g, int64_t S, float scale, float* p, bf16* a) {
  for (int64_t h0 = 0; h0 < g; h0 += HEADS) {
    const float* qq = q + h0 * 16 * NCH;
    bf16* aa = a + h0 * 16 * NCH;
    switch (std::min<int64_t>(HEADS, g - h0)) {
      case 4: scores<NCH, 4>(qq, Kc, ss, keys, n, S, scale, p); softmax_pv<NCH, 4>(Vc, ss, keys, n, S, p, aa); break;
      case 3: scores<NCH, 3>(qq, Kc, ss, keys, n, S, scale, p); softmax_pv<NCH, 3>(Vc, ss, keys, n, S, p, aa); break;
      case 2: scores<NCH, 2>(qq, Kc, ss, keys, n, S, scale, p); softmax_pv<NCH, 2>(Vc, ss, keys, n, S, p, aa); break;
      default: scores<NCH, 1>(qq, Kc, ss, keys, n, S, scale, p); softmax_pv<NCH, 1>(Vc, ss, keys, n, S, p, aa);
    }
  }
}
// The same attention on AMX tiles, a group of rows at a time: the g query heads of one key/value
// head for R = 16 / g rows fill a tile's 16 rows.
// Why: the loop above spends a horizontal sum on every (query, key) score and 4 FMAs on every
// (query, key) weight of V, so after a long context attention is a large share of a verify, the
// scores most of it (docs/performance.md). On tiles, 16 queries x 16 keys of scores, or 16 queries x 32 keys
// x 16 of D of the weighted sum, are one TDPBF16PS.
//  - scores: A = the queries (bf16: q is rounded to bf16 before it is widened), B = 16 keys in the
//    pair-interleaved layout (the 32-bit transpose of their cache rows), for every slot a row of the
//    group may see; each row's own keys' scores are then gathered in cache order.
//  - softmax: the loop's, per query, on those gathered scores.
//  - weights @ V: 32 keys a step, A = the weights, B = V in the pair layout. The weights are split
//    into bf16 hi + lo parts (two products, ~16 bits of each weight's 24; the sum stays fp32).
// Numerics: each score is the tile unit's fp32 sum over D, each output its fp32 sum over the row's
// keys in cache order, 32 at a step. A row's k-th key lands in step k / 32 whatever the other rows
// of the group see: the rows of a group that read different keys in one step (siblings in a draft
// tree) get a product each, with the other rows' weights zero there (adding +0). So a row's
// arithmetic depends only on its query and the keys it sees, and a verify still agrees bit for bit
// with one-token forwards.

// Which slots each row of a forward reads, in cache order: built once a forward, before the
// parallel region. common(a, b): how many first keys rows a and b of one group of R rows share (a
// draft tree's rows share the cache and the prefix, then part ways), so attend_amx tells which rows
// read the same keys in a step by one comparison. Once a forward, not for every layer and key/value
// head: scanning a mask's rows and comparing them key by key at every step costs a tree verify a
// measurable share of its time (docs/performance.md).
// A mask's lists are stored back to back (row t's from start[t]): as many entries as the mask has
// visible slots, not T x S (a batch's prefill of 8 long prompts: ~7M, not ~100M).
struct KeyLists {
  const bool* M;                     // (T, S) mask, or nullptr: row t sees slots 0..past+t
  int64_t R;
  std::vector<int64_t> list, start, n, lcp;   // the keys ((S,) 0..S-1 if causal), (T,), (T,), (T, R)
  KeyLists(const bool* M, int64_t T, int64_t S, int64_t past, int64_t R)
      : M(M), R(R), start(M ? T : 0), n(T), lcp(M ? T * R : 0) {
    if (!M) {
      list.resize(S);
      std::iota(list.begin(), list.end(), 0);
      for (int64_t t = 0; t < T; ++t) n[t] = past + t + 1;
    }
    for (int64_t t = 0; M && t < T; ++t) {      // count, then list
      n[t] = std::count(M + t * S, M + (t + 1) * S, true);
      start[t] = t ? start[t - 1] + n[t - 1] : 0;
    }
    if (M) list.resize(T ? start[T - 1] + n[T - 1] : 0);
    for (int64_t t = 0; M && t < T; ++t)
      for (int64_t j = 0, k = start[t]; j < S; ++j)
        if (M[t * S + j]) list[k++] = j;
    for (int64_t t = 0; M && t < T; ++t)        // against each row of its own group
      for (int64_t u = t / R * R; u < std::min(T, t / R * R + R); ++u) {
        const int64_t m = std::min(n[t], n[u]);
        lcp[t * R + u % R] = std::mismatch(of(t), of(t) + m, of(u)).first - of(t);
      }
  }
  const int64_t* of(int64_t t) const { return list.data() + (M ? start[t] : 0); }
  int64_t common(int64_t t, int64_t u) const { return M ? lcp[t * R + u % R] : std::min(n[t], n[u]); }
};

#ifdef HAS_DPBF16
struct TileScratch {                 // one thread's buffers for attend_amx
  std::vector<float> sc;             // (16, ld) the group's scores, then each query's weights
  std::vector<bf16> qa, phi, plo;    // (16, D) the queries; (16, ld) weights, hi and lo parts
  std::vector<bf16> ahi, alo;        // (16, 32) one step's weights for a subset of the rows
  std::vector<int> set_of;           // (16,) which key set a row reads in the current step
  alignas(64) int32_t bt[4][256];    // B tiles: 16 key pairs or 16 keys x 16 columns
  alignas(64) float cb[16 * 64];     // C tiles stored
  TileScratch(int64_t ld, int64_t D)
      : sc(16 * ld), qa(16 * D), phi(16 * ld), plo(16 * ld), ahi(16 * 32), alo(16 * 32), set_of(16) {}
};

__attribute__((target("amx-tile,amx-bf16,avx512f,avx512bf16")))
static void tiles_on() {
  TileConfig cfg;
  for (int i = 0; i < 8; ++i) cfg.rows[i] = 16, cfg.colsb[i] = 64;   // every tile (16, 64 bytes)
  TILE_CONFIG(cfg);
}

__attribute__((target("amx-tile"))) static void tiles_off() { _tile_release(); }

// rows r[0..15] of 16 dwords -> r[i] = column i
static inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {                  // row pairs, dwords interleaved
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {                  // row quads, qwords interleaved
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int i = 0; i < 4; ++i) {                  // 128-bit lanes across quads
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
  }
}

// B tile of keys j0..j0+15 (slots from `span` on zero), dims 32c..32c+31: their rows transposed
// into the pair layout, dst (16, 16) dwords
__attribute__((target("avx512f,avx512bw")))
static inline void k_tile(const bf16* Kc, int64_t ss, int64_t j0, int64_t span, int64_t c, int32_t* dst) {
  __m512i r[16];
  for (int i = 0; i < 16; ++i)
    r[i] = j0 + i < span ? _mm512_loadu_si512(Kc + (j0 + i) * ss + 32 * c) : _mm512_setzero_si512();
  transpose16(r);
  for (int i = 0; i < 16; ++i) _mm512_storeu_si512(dst + 16 * i, r[i]);
}

// NT B tiles of 32 keys' values (slots keys[0..len), the rest zero), dims d0 + 16j.. in tile j:
// key pair i interleaved in row i, dst (NT, 16, 16) dwords
__attribute__((target("avx512f,avx512bw")))
static inline void v_tiles(const bf16* Vc, int64_t ss, const int64_t* keys, int64_t len, int64_t d0, int NT,
                           int32_t* dst) {
  const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                         23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int64_t i = 0; i < 16; ++i) {
    const bf16* va = 2 * i < len ? Vc + keys[2 * i] * ss + d0 : nullptr;
    const bf16* vb = 2 * i + 1 < len ? Vc + keys[2 * i + 1] * ss + d0 : nullptr;
    for (int j = 0; j < NT; ++j) {
      const __m256i x = va ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(va + 16 * j)) : _mm256_setzero_si256();
      const __m256i y = vb ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vb + 16 * j)) : _mm256_setzero_si256();
      _mm512_storeu_si512(dst + 256 * j + 16 * i, _mm512_permutexvar_epi16(pairs, _mm512_inserti64x4(_mm512_castsi256_si512(x), y, 1)));
    }
  }
}

// rows [t0, t1) x the g heads of key/value head kvh: queries Qb (T, Hq, D) bf16, keys / values Kc,
// Vc (slot stride ss), the rows' key lists ks -> A (T, Hq * D). The tiles are configured (tiles_on).
// part: ALL; SCORES, the scores alone into `shared` (16, ld); or REST, the rest from the scores
// another thread left in `shared` (the same arithmetic, split between two threads).
enum Part { ALL, SCORES, REST };
__attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16")))
static void attend_amx(const bf16* Qb, int64_t Hq, int64_t g, int64_t kvh, int64_t t0, int64_t t1, int64_t D,
                       const bf16* Kc, const bf16* Vc, int64_t ss, const KeyLists& ks,
                       float scale, int64_t ld, TileScratch& w, bf16* A, Part part = ALL, float* shared = nullptr) {
  const int64_t R = t1 - t0, nq = R * g, NC = D / 32;
  int64_t nmax = 0, span = 0;                  // the most keys of a row; the slots any row sees
  for (int64_t t = t0; t < t1; ++t)
    if (ks.n[t]) nmax = std::max(nmax, ks.n[t]), span = std::max(span, ks.of(t)[ks.n[t] - 1] + 1);
  auto key = [&](int64_t r, int64_t i) { return ks.of(t0 + r)[i]; };

  // scores: every slot a row of the group may see
  float* const sc = part == ALL ? w.sc.data() : shared;
  if (part != REST) {
    std::fill(w.qa.begin(), w.qa.end(), bf16(0.f));
    for (int64_t t = t0; t < t1; ++t)
      std::copy(Qb + (t * Hq + kvh * g) * D, Qb + (t * Hq + (kvh + 1) * g) * D, w.qa.data() + (t - t0) * g * D);
    TILE_LOAD(1, w.qa.data(), D * 2);
    if (NC > 1) TILE_LOAD(2, w.qa.data() + 32, D * 2);
    if (NC > 2) { TILE_LOAD(3, w.qa.data() + 64, D * 2); TILE_LOAD(4, w.qa.data() + 96, D * 2); }
    for (int64_t j0 = 0; j0 < span; j0 += 16) {
      for (int64_t c = 0; c < NC; ++c) k_tile(Kc, ss, j0, span, c, w.bt[c]);
      _tile_zero(0);
      TILE_LOAD(5, w.bt[0], 64);
      _tile_dpbf16ps(0, 1, 5);
      if (NC > 1) { TILE_LOAD(6, w.bt[1], 64); _tile_dpbf16ps(0, 2, 6); }
      if (NC > 2) { TILE_LOAD(5, w.bt[2], 64); _tile_dpbf16ps(0, 3, 5); TILE_LOAD(6, w.bt[3], 64); _tile_dpbf16ps(0, 4, 6); }
      _tile_stored(0, sc + j0, ld * 4);
    }
    if (part == SCORES) return;
  }

  // each query's weights over its own keys (gathered in place: key(r, j) >= j), split hi + lo
  const int64_t steps = (nmax + 31) / 32;
  for (int64_t q = 0; q < 16; ++q) {
    float* ph = sc + q * ld;
    const int64_t r = q / g, n = q < nq ? ks.n[t0 + r] : 0;
    for (int64_t j = 0; j < n; ++j) ph[j] = ph[key(r, j)] * scale;
    // softmax_row's weights, each divided by the sum here rather than in a pass of its own
    const __m512 total = _mm512_set1_ps(n ? softmax_exp(ph, n) : 1.f);
    for (int64_t j = 0; j < steps * 32; j += 16) {
      const __mmask16 k16 = j >= n ? 0 : n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1);
      const __m512 v = _mm512_maskz_div_ps(k16, _mm512_maskz_loadu_ps(k16, ph + j), total);
      const __m256i hi = (__m256i)_mm512_cvtneps_pbh(v);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w.phi.data() + q * ld + j), hi);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w.plo.data() + q * ld + j),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(v, widen16(hi).v)));
    }
  }

  // weights @ V, 32 keys a step, 64 of D a pass: C tiles 0-3 (16 queries, 16 of D each)
  for (int64_t d0 = 0; d0 < D; d0 += 64) {
    const int NT = (int)std::min<int64_t>(4, (D - d0) / 16);
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int64_t st = 0; st < steps; ++st) {
      // the rows' key lists in this step, in sets that agree (a causal group: one set)
      int nsets = 0;
      int64_t rep[16], len[16];
      for (int64_t r = 0; r < R; ++r) {
        const int64_t lr = std::min<int64_t>(ks.n[t0 + r] - 32 * st, 32);
        w.set_of[r] = -1;
        if (lr <= 0) continue;
        for (int k = 0; k < nsets && w.set_of[r] < 0; ++k) {
          if (ks.common(t0 + r, t0 + rep[k]) >= 32 * st + std::min(lr, len[k])) {
            w.set_of[r] = k;
            if (lr > len[k]) rep[k] = r, len[k] = lr;
          }
        }
        if (w.set_of[r] < 0) w.set_of[r] = nsets, rep[nsets] = r, len[nsets] = lr, ++nsets;
      }
      for (int k = 0; k < nsets; ++k) {
        v_tiles(Vc, ss, ks.of(t0 + rep[k]) + 32 * st, len[k], d0, NT, w.bt[0]);   // B: the set's 32 keys
        if (nsets == 1) {                        // A: the weights of this step (rows past their keys hold 0)
          TILE_LOAD(4, w.phi.data() + 32 * st, ld * 2);
          TILE_LOAD(5, w.plo.data() + 32 * st, ld * 2);
        } else {                                 // only this set's rows
          for (int64_t q = 0; q < 16; ++q) {
            const bool in = q < nq && w.set_of[q / g] == k;
            for (int64_t i = 0; i < 32; ++i) {
              w.ahi[q * 32 + i] = in ? w.phi[q * ld + 32 * st + i] : bf16(0.f);
              w.alo[q * 32 + i] = in ? w.plo[q * ld + 32 * st + i] : bf16(0.f);
            }
          }
          TILE_LOAD(4, w.ahi.data(), 64);
          TILE_LOAD(5, w.alo.data(), 64);
        }
        TILE_LOAD(6, w.bt[0], 64); _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(0, 5, 6);
        if (NT > 1) { TILE_LOAD(7, w.bt[1], 64); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(1, 5, 7); }
        if (NT > 2) { TILE_LOAD(6, w.bt[2], 64); _tile_dpbf16ps(2, 4, 6); _tile_dpbf16ps(2, 5, 6); }
        if (NT > 3) { TILE_LOAD(7, w.bt[3], 64); _tile_dpbf16ps(3, 4, 7); _tile_dpbf16ps(3, 5, 7); }
      }
    }
    _tile_stored(0, w.cb, 256);
    if (NT > 1) _tile_stored(1, w.cb + 16, 256);
    if (NT > 2) _tile_stored(2, w.cb + 32, 256);
    if (NT > 3) _tile_stored(3, w.cb + 48, 256);
    for (int64_t q = 0; q < nq; ++q) {
      bf16* a = A + (t0 + q / g) * Hq * D + (kvh * g + q % g) * D + d0;
      for (int j = 0; j < NT; ++j) store16(a + 16 * j, F16{_mm512_load_ps(w.cb + q * 64 + 16 * j)});
    }
  }
}
#else   // no tiles: never called (on_tiles() is false), declared for layers()
struct TileScratch { TileScratch(int64_t, int64_t) {} };
static void tiles_on() {}
static void tiles_off() {}
enum Part { ALL, SCORES, REST };
static void attend_amx(const bf16*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, const bf16*, const bf16*,
                       int64_t, const KeyLists&, float, int64_t, TileScratch&, bf16*, Part = ALL, float* = nullptr) {}
#endif

// ---------------------------------------------------------------------------------------------
// All the layers of a forward in ONE parallel region. Why: a layer called as 5 parallel regions with
// serial steps between them (norms, RoPE, SiLU, residual adds on one thread while the other waits)
// streams its weights well below the rate a matrix alone reaches (docs/performance.md;
// scripts/profile_ar.py measures it). Here each thread takes its share of every step, the steps separated by a spin barrier, and
// the per-row arithmetic is exactly that of the one-layer path it replaces (the same roundings in
// the same order), so the results are bit for bit the same.

// How a thread waits for the others. On a busy machine (a browser, another process) one of the
// threads can be descheduled for a whole time slice (milliseconds) while the others wait for it.
// A waiter that spins or yields keeps its core, so the scheduler has nowhere to run the late
// thread until its own core frees up; a waiter that sleeps in the kernel (futex) hands its core
// over at once. So a waiter spins for a bounded time (a step's threads normally arrive within
// microseconds of each other, and a spin answers faster than a wake-up), then sleeps until the
// last thread wakes it. Waiting never changes which thread computes what: outputs are the same
// bits in every mode.
//   BARRIER_SLEEP  spin up to `spin_ns`, then futex-wait (the default)
//   BARRIER_SPIN   spin 2^14 pauses, then sched_yield in a loop (the loop this replaced, kept for
//                  measuring the two against each other: SPECLAB_BARRIER=spin)
enum { BARRIER_SLEEP = 0, BARRIER_SPIN = 1 };
static std::atomic<int> barrier_mode{BARRIER_SLEEP};
static std::atomic<int64_t> spin_ns{50000};

static inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now().time_since_epoch()).count();
}
static inline void futex_wait(std::atomic<int>* word, int seen) {
  syscall(SYS_futex, reinterpret_cast<int*>(word), FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
}
static inline void futex_wake_all(std::atomic<int>* word) {
  syscall(SYS_futex, reinterpret_cast<int*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

// Wait while word == seen: spin, then (BARRIER_SLEEP) sleep on the word. `sleepers` counts the
// threads asleep on it, so the thread that changes the word calls the kernel only when one is.
static void await_change(std::atomic<int>& word, int seen, std::atomic<int>& sleepers) {
  if (barrier_mode.load(std::memory_order_relaxed) == BARRIER_SPIN) {
    for (int spin = 0; word.load(std::memory_order_acquire) == seen; ++spin)
      if (spin < 1 << 14) _mm_pause(); else std::this_thread::yield();
    return;
  }
  const int64_t until = now_ns() + spin_ns.load(std::memory_order_relaxed);
  for (int spin = 0; word.load(std::memory_order_acquire) == seen; ++spin) {
    _mm_pause();
    if ((spin & 63) == 63 && now_ns() > until) {
      sleepers.fetch_add(1, std::memory_order_seq_cst);
      // the waker stores the word, then reads sleepers (both seq_cst): either it sees this
      // sleeper and wakes it, or this load sees the new word; FUTEX_WAIT also returns at once
      // when the word no longer holds `seen`
      while (word.load(std::memory_order_seq_cst) == seen) futex_wait(&word, seen);
      sleepers.fetch_sub(1, std::memory_order_seq_cst);
      return;
    }
  }
}

// Change the word and wake whoever sleeps on it.
static inline void publish(std::atomic<int>& word, int value, std::atomic<int>& sleepers) {
  word.store(value, std::memory_order_seq_cst);
  if (sleepers.load(std::memory_order_seq_cst)) futex_wake_all(&word);
}

void set_barrier(int64_t mode, int64_t spin_us) {
  TORCH_CHECK(mode == BARRIER_SLEEP || mode == BARRIER_SPIN, "set_barrier: mode 0 (spin, then sleep) or 1 (spin, then yield)");
  TORCH_CHECK(spin_us >= 0, "set_barrier: spin_us must be >= 0");
  barrier_mode.store((int)mode);
  spin_ns.store(spin_us * 1000);
}

// A barrier for the W threads of one call (generation counting).
struct Team {
  std::atomic<int> started{0};     // 1 once the team's first thread has set `chunk`
  std::atomic<int64_t> chunk{0};
  std::atomic<int> arrived{0};
  std::atomic<int> phase{0};
  std::atomic<int> sleepers{0};
  void wait(int W) {
    if (W == 1) return;
    const int ph = phase.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) == W - 1) {
      arrived.store(0, std::memory_order_relaxed);
      publish(phase, ph + 1, sleepers);
      return;
    }
    await_change(phase, ph, sleepers);
  }
};

// run(me, W) on W <= NT threads at once, NT = the threads torch uses as the caller read it (1
// inside another parallel region). The caller sizes its per-thread buffers by the same NT: torch's
// count is process-wide and another thread may change it meanwhile (speclab.models.kernels.TeamSize
// does, forward by forward), so it is read once per call.
// at::parallel_for over one index per thread gives each thread of the OpenMP team one index; the
// first thread's chunk tells every thread how many share the call, so no barrier can wait for a
// thread that is not there.
template <typename F>
static void in_team(Team& team, int64_t NT, const F& run) {
#if AT_PARALLEL_OPENMP
  at::parallel_for(0, NT, 1, [&](int64_t b0, int64_t b1) {
    if (b0 == 0) {
      team.chunk.store(b1, std::memory_order_release);
      publish(team.started, 1, team.sleepers);
    }
    await_change(team.started, 0, team.sleepers);
    const int64_t c = team.chunk.load(std::memory_order_acquire);
    run((int)(b0 / c), (int)((NT + c - 1) / c));
  });
#else
  run(0, 1);                                 // a task pool gives no guarantee that W threads run at once
#endif
}

// [lo, hi) of n items for thread me of W
static inline std::pair<int64_t, int64_t> share(int64_t n, int me, int W) {
  return {n * me / W, n * (me + 1) / W};
}

// thread me's columns of 16 outputs of a packed matrix of nb blocks with K inputs for T rows, for
// blocks(): any 16 on AMX tiles; for the loops, halves of blocks (32) for a prompt's rows, whole
// blocks for a step or a verify. In whole blocks two threads split SmolLM2's 576-wide products
// 5 / 4 and the one with 4 waits at the barrier: in halves a 77- or 114-row prefill took 2-3% less
// time (AVX2 and AVX512-BF16 alike). Up to 6 rows the weights' stream sets the time, and halves
// (two threads reading halves of the same lines) measured 2-4% slower. Either way the same bits.
static inline std::pair<int64_t, int64_t> cols(int64_t nb, int64_t K, int64_t T, int me, int W) {
  if (on_tiles(K)) return share(4 * nb, me, W);
  if (T <= 6) {
    auto [b0, b1] = share(nb, me, W);
    return {4 * b0, 4 * b1};
  }
  auto [h0, h1] = share(2 * nb, me, W);
  return {2 * h0, 2 * h1};
}

at::Tensor layers(at::Tensor x, std::vector<at::Tensor> ln1, std::vector<at::Tensor> wqkv,
                     std::vector<at::Tensor> wo, std::vector<at::Tensor> ln2,
                     std::vector<at::Tensor> w13, std::vector<at::Tensor> w2, at::Tensor kv,
                     int64_t l0, at::Tensor cos, at::Tensor sin, at::Tensor pos, int64_t past,
                     at::Tensor vis, int64_t Hq, int64_t Hkv, double eps) {
  const int64_t L = (int64_t)wqkv.size(), T = x.size(0), C = x.size(1), D = kv.size(4), g = Hq / Hkv;
  const int64_t S = past + T, W3 = (Hq + 2 * Hkv) * D, I = w13[0].size(0) * B / 2;
  // every check before the parallel region: a thread must never leave it while the others wait
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.is_contiguous() && x.dim() == 2, "layers: x must be contiguous (T, C) bf16");
  TORCH_CHECK(kv.dim() == 5 && kv.is_contiguous() && kv.scalar_type() == at::kBFloat16 && kv.size(0) >= l0 + L &&
              kv.size(2) == Hkv && kv.size(3) >= S, "layers: the cache must be a contiguous (layers, 2, Hkv, slots, D) bf16 tensor with room for ", S, " slots");
  TORCH_CHECK(D == 32 || D == 64 || D == 128, "layers: head_dim must be 32, 64 or 128");
  TORCH_CHECK(I % 16 == 0, "layers: the MLP width must be a multiple of 16");
  TORCH_CHECK(pos.scalar_type() == at::kLong && pos.numel() == T, "layers: pos must hold T int64 positions");
  TORCH_CHECK(!vis.numel() || (vis.scalar_type() == at::kBool && vis.is_contiguous() && vis.numel() == T * S),
              "layers: vis must be a contiguous (T, past + T) bool mask, or empty for causal");
  for (int64_t l = 0; l < L; ++l)
    TORCH_CHECK(wqkv[l].size(0) * B == W3 && wqkv[l].size(1) * 2 == C && wo[l].size(0) * B == C &&
                wo[l].size(1) * 2 == Hq * D && w13[l].size(1) * 2 == C && w13[l].size(0) * B == 2 * I &&
                w2[l].size(0) * B == C && w2[l].size(1) * 2 == I, "layers: layer ", l, " has packed weights of other shapes");
  const int64_t hs = kv.stride(2), ss = kv.stride(3);
  bf16* KV = kv.data_ptr<bf16>();
  const int64_t* P = pos.data_ptr<int64_t>();
  const bool* M = vis.numel() ? vis.data_ptr<bool>() : nullptr;   // (T, S) or causal
  const bf16* cs = cos.data_ptr<bf16>();
  const bf16* sn = sin.data_ptr<bf16>();
  const float scale = 1.f / std::sqrt((float)D);

  const int64_t NT = std::max(1, at::get_num_threads());
  auto bf = x.options();
  at::Tensor out[2] = {at::empty_like(x), at::empty_like(x)};
  auto hbuf = at::empty({NT, T, C}, bf);       // each thread's normed rows (each norms all rows itself)
  auto x1buf = at::empty({NT, T, C}, bf);      // each thread's x + attention output
  auto qkv = at::empty({T, W3}, bf);
  auto qf = at::empty({T, Hq, D}, bf.dtype(at::kFloat));
  auto qb = at::empty({T, Hq, D}, bf);          // the same queries in bf16 (exact), for AMX tiles
  auto attn = at::empty({T, Hq * D}, bf);
  auto o = at::empty({T, C}, bf);
  auto gu = at::empty({T, 2 * I}, bf);
  auto mid = at::empty({T, I}, bf);
  auto dn = at::empty({T, C}, bf);
  bf16 *QKV = qkv.data_ptr<bf16>(), *A = attn.data_ptr<bf16>(), *O = o.data_ptr<bf16>();
  bf16 *GU = gu.data_ptr<bf16>(), *Mi = mid.data_ptr<bf16>(), *DN = dn.data_ptr<bf16>();
  float* Q = qf.data_ptr<float>();
  bf16* Qb = qb.data_ptr<bf16>();
  // attention on AMX tiles where the products run on them (attend_amx): groups of R rows whose g
  // queries per key/value head fill one tile's 16 rows
  const bool tiles = on_tiles(D) && g <= 16;
  const int64_t R = tiles ? 16 / g : 1, groups = (T + R - 1) / R, ld = (S + 31) / 32 * 32;

  const KeyLists ks(M, T, S, past, R);          // which slots each row reads, for every layer and head
  // Attention items (row group, key/value head) go round robin. When they do not divide evenly
  // (one row of SmolLM2: 3 heads on 2 threads, so one thread took two items while the other
  // waited), the last item's scores go to the last thread, which has an item fewer, and the item's
  // owner takes them from `split_sc` once `split_ready` says this layer's are there.
  std::vector<float> split_sc(tiles ? 16 * ld : 0);
  std::atomic<int> split_ready{-1};             // the layer whose split scores are there
  std::atomic<int> split_sleepers{0};

  Team team;
  in_team(team, NT, [&](int me, int W) {
    bf16* h = hbuf.data_ptr<bf16>() + me * T * C;
    bf16* x1 = x1buf.data_ptr<bf16>() + me * T * C;
    std::vector<float> p(tiles ? 0 : 4 * S);
    std::unique_ptr<TileScratch> tw(tiles ? new TileScratch(ld, D) : nullptr);
    const int64_t items = T * Hkv;            // (row, key/value head): RoPE and attention
    for (int64_t l = 0; l < L; ++l) {
      const bf16* X = l == 0 ? x.data_ptr<bf16>() : out[(l - 1) % 2].data_ptr<bf16>();
      bf16* Y = out[l % 2].data_ptr<bf16>();
      bf16* K = KV + (l0 + l) * kv.stride(0);
      bf16* V = K + kv.stride(1);

      rms_rows(X, ln1[l].data_ptr<bf16>(), h, T, C, (float)eps);
      auto [q0, q1] = cols(wqkv[l].size(0), C, T, me, W);
      blocks(h, T, C, wqkv[l].data_ptr<bf16>(), wqkv[l].size(1), q0, q1, QKV, W3);
      team.wait(W);

      for (int64_t i = me; i < items; i += W) {   // RoPE: q to fp32, k and v into the cache
        const int64_t t = i / Hkv, kvh = i % Hkv;
        const bf16* c = cs + P[t] * D;
        const bf16* s = sn + P[t] * D;
        for (int64_t hh = kvh * g; hh < (kvh + 1) * g; ++hh) {
          bf16* qr = Qb + (t * Hq + hh) * D;
          rope(QKV + t * W3 + hh * D, c, s, qr, D);
          for (int64_t d = 0; d < D; ++d) Q[(t * Hq + hh) * D + d] = f32(qr[d]);
        }
        rope(QKV + t * W3 + (Hq + kvh) * D, c, s, K + kvh * hs + (past + t) * ss, D);
        std::copy(QKV + t * W3 + (Hq + Hkv + kvh) * D, QKV + t * W3 + (Hq + Hkv + kvh + 1) * D,
                  V + kvh * hs + (past + t) * ss);
      }
      team.wait(W);

      // attention, round robin over (row group, key/value head): a causal prefill's rows grow in
      // cost, so thread i takes items i, i + W, ... rather than one contiguous run
      if (tiles) tiles_on();
      const int64_t last = groups * Hkv - 1;
      const bool split = tiles && W > 1 && (last + 1) % W != 0;
      if (split && me == W - 1) {
        const int64_t kvh = last % Hkv, t0 = last / Hkv * R, t1 = std::min(T, t0 + R);
        attend_amx(Qb, Hq, g, kvh, t0, t1, D, K + kvh * hs, V + kvh * hs, ss, ks, scale, ld, *tw, A, SCORES,
                   split_sc.data());
        _mm_sfence();                           // the tile stores before the flag
        publish(split_ready, (int)l, split_sleepers);
      }
      for (int64_t i = me; i < groups * Hkv; i += W) {
        const int64_t kvh = i % Hkv, t0 = i / Hkv * R, t1 = std::min(T, t0 + R);
        if (split && i == last) {
          // the flag holds l - 1 (or -1) until the scores of layer l are there
          for (int seen; (seen = split_ready.load(std::memory_order_acquire)) != (int)l;)
            await_change(split_ready, seen, split_sleepers);
          attend_amx(Qb, Hq, g, kvh, t0, t1, D, K + kvh * hs, V + kvh * hs, ss, ks, scale, ld, *tw, A, REST,
                     split_sc.data());
          continue;
        }
        if (tiles) {
          attend_amx(Qb, Hq, g, kvh, t0, t1, D, K + kvh * hs, V + kvh * hs, ss, ks, scale, ld, *tw, A);
          continue;
        }
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t n = ks.n[t];
          const int64_t* seen = ks.of(t);
          const float* q = Q + (t * Hq + kvh * g) * D;
          bf16* a = A + t * Hq * D + kvh * g * D;
          switch (D / 16) {
            case 2: attend_heads<2>(q, K + kvh * hs, V + kvh * hs, ss, seen, n, g, S, scale, p.data(), a); break;
            case 4: attend_heads<4>(q, K + kvh * hs, V + kvh * hs, ss, seen, n, g, S, scale, p.data(), a); break;
            default: attend_heads<8>(q, K + kvh * hs, V + kvh * hs, ss, seen, n, g, S, scale, p.data(), a);
          }
        }
      }
      if (tiles) tiles_off();
      team.wait(W);

      auto [o0, o1] = cols(wo[l].size(0), Hq * D, T, me, W);
      blocks(A, T, Hq * D, wo[l].data_ptr<bf16>(), wo[l].size(1), o0, o1, O, C);
      team.wait(W);

      add_rows(X, O, x1, T * C);                // every thread: x1 and its norm, for its own use
      rms_rows(x1, ln2[l].data_ptr<bf16>(), h, T, C, (float)eps);
      auto [m0, m1] = cols(w13[l].size(0), C, T, me, W);
      blocks(h, T, C, w13[l].data_ptr<bf16>(), w13[l].size(1), m0, m1, GU, 2 * I);
      team.wait(W);

      auto [c0, c1] = share(I / 16, me, W);     // bf16(bf16(silu(gate)) * up), as torch rounds it
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 16 * c0; c < 16 * c1; c += 16) {
          const F16 gv = load16(GU + t * 2 * I + c);
          const F16 sg = gv / (fset(1.f) + exp16(fzero() - gv));
          store16(Mi + t * I + c, round16(sg) * load16(GU + t * 2 * I + I + c));
        }
      team.wait(W);

      auto [d0, d1] = cols(w2[l].size(0), I, T, me, W);
      blocks(Mi, T, I, w2[l].data_ptr<bf16>(), w2[l].size(1), d0, d1, DN, C);
      for (int64_t t = 0; t < T; ++t)           // the residual, on this thread's output columns
        add_rows(x1 + t * C + d0 * 16, DN + t * C + d0 * 16, Y + t * C + d0 * 16, (d1 - d0) * 16);
      team.wait(W);
    }
  });
  return out[(L - 1) % 2];
}

// A plain streaming read of a buffer (no arithmetic to wait on: 64-byte loads OR-ed together),
// split over the threads: the rate the memory system gives a reader, for the bench's bandwidth
// limit (torch's reductions can be bound by their own arithmetic, and then read below the memory's
// rate).
int64_t stream_read(at::Tensor buf) {
  TORCH_CHECK(buf.is_contiguous() && buf.nbytes() % 256 == 0, "stream_read: a contiguous buffer of a multiple of 256 bytes");
  const char* p = static_cast<const char*>(buf.data_ptr());
  const int64_t n = buf.nbytes() / 256;
  std::atomic<int64_t> sink{0};
  at::parallel_for(0, n, 1024, [&](int64_t i0, int64_t i1) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = i0; i < i1; ++i) {         // 256 bytes a step, in 32-byte loads on every path
      const __m256i* q = reinterpret_cast<const __m256i*>(p + i * 256);
      a0 = _mm256_or_si256(a0, _mm256_or_si256(_mm256_loadu_si256(q), _mm256_loadu_si256(q + 1)));
      a1 = _mm256_or_si256(a1, _mm256_or_si256(_mm256_loadu_si256(q + 2), _mm256_loadu_si256(q + 3)));
      a2 = _mm256_or_si256(a2, _mm256_or_si256(_mm256_loadu_si256(q + 4), _mm256_loadu_si256(q + 5)));
      a3 = _mm256_or_si256(a3, _mm256_or_si256(_mm256_loadu_si256(q + 6), _mm256_loadu_si256(q + 7)));
    }
    const __m256i a = _mm256_or_si256(_mm256_or_si256(a0, a1), _mm256_or_si256(a2, a3));
    sink += _mm256_extract_epi64(a, 0) | _mm256_extract_epi64(a, 1) | _mm256_extract_epi64(a, 2) | _mm256_extract_epi64(a, 3);
  });
  return sink.load();
}

// The kernel's own exp and bf16 rounding on fp32 values (flat), for the tests that check every path
// against the others at the edges (denormals, infinities, NaN, exponents past a float's)
at::Tensor exp_f32(at::Tensor x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.numel() % 16 == 0, "exp_f32: contiguous fp32, a multiple of 16");
  auto y = at::empty_like(x);
  for (int64_t i = 0; i < x.numel(); i += 16) fstore(y.data_ptr<float>() + i, exp16(fload(x.data_ptr<float>() + i)));
  return y;
}

at::Tensor to_bf16(at::Tensor x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.numel() % 16 == 0, "to_bf16: contiguous fp32, a multiple of 16");
  auto y = at::empty(x.sizes(), x.options().dtype(at::kBFloat16));
  for (int64_t i = 0; i < x.numel(); i += 16) store16(y.data_ptr<bf16>() + i, fload(x.data_ptr<float>() + i));
  return y;
}

// The compute calls release the GIL (they touch no Python object between their arguments and their
// result), so another Python thread runs meanwhile: PEARL's draft lane beside its target lane.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto no_gil = py::call_guard<py::gil_scoped_release>();
  m.def("isa", &isa, "the instruction set this build runs: avx512bf16, avx512 or avx2");
  m.def("stream_read", &stream_read, "read a buffer once, as fast as the memory system gives it (the bench's bandwidth probe)", no_gil);
  m.def("rms_norm", &rms_norm, "LlamaRMSNorm of bf16 rows", no_gil);
  m.def("layers", &layers, "Llama decoder layers l0.. over T bf16 rows in one parallel region, the KV cache written in place", no_gil);
  m.def("set_barrier", &set_barrier, "how threads wait for each other: mode 0 spins spin_us then sleeps (futex), 1 spins then yields");
  m.def("use_amx", &use_amx, "the product on AMX tiles from now on (True if the OS granted them; always False off avx512bf16)");
  m.def("pack", &pack, "W (N, K) bf16 -> the kernel's packed layout (N/64, K/2, 64, 2)");
  m.def("linear", &packed_linear, "x (T, K) bf16 @ W^T with W packed -> (T, N) bf16", no_gil);
  m.def("exp_f32", &exp_f32, "the kernel's exp of fp32 values (tests)");
  m.def("to_bf16", &to_bf16, "the kernel's rounding of fp32 values to bf16 (tests)");
}
