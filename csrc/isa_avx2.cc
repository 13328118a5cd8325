// AVX2 + FMA bodies of the native kernel: W = 8 query lanes per vector.
#include "isa.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,bmi,bmi2")

namespace {

#include "exp_poly.h"

struct V {
  static constexpr int W = 8;
  static constexpr int RA = 6;  // rows per score pass
  static constexpr int UA = 2;  // columns per iteration of a score pass: RA x UA accumulators
  static constexpr int JB = 12;  // columns per accumulation pass
  __m256 x;
  V() = default;
  V(__m256 a) : x(a) {}
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float a) { return _mm256_set1_ps(a); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  void store(float* p) const { _mm256_storeu_ps(p, x); }
  static __m256i first(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V load_n(const float* p, int n) { return _mm256_maskload_ps(p, first(n)); }
  void store_n(float* p, int n) const { _mm256_maskstore_ps(p, first(n), x); }
  static V keep(V a, int n) { return n == W ? a : V(_mm256_and_ps(a.x, _mm256_castsi256_ps(first(n)))); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a.x, b.x, c.x); }
  static V max(V a, V b) { return _mm256_max_ps(a.x, b.x); }
  static V min(V a, V b) { return _mm256_min_ps(a.x, b.x); }
  static float sum(V a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.x), _mm256_extractf128_ps(a.x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static bool any_gt(V a, V b) { return _mm256_movemask_ps(_mm256_cmp_ps(a.x, b.x, _CMP_GT_OQ)) != 0; }
  // e^x: exp_reduced (exp_poly.h), then 2^n built in the exponent bits (n in [-126, 128]: 128 gives inf),
  // results below the smallest normal (x < -87.34) flushed to 0; NaN propagates
  static V exp(V a) {
    const __m256 lo = _mm256_set1_ps(-87.3365447f);
    const V x = _mm256_max_ps(lo, _mm256_min_ps(_mm256_set1_ps(88.8f), a.x));
    const V n = _mm256_round_ps(_mm256_mul_ps(x.x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    // 2^n in two halves (n = 128 would not fit one exponent field): 2^(n - h) 2^h, h = n / 2
    const __m256i ni = _mm256_cvtps_epi32(n.x);
    const __m256i h = _mm256_srai_epi32(ni, 1);
    const __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, _mm256_set1_epi32(127)), 23));
    const __m256 p2 = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), _mm256_set1_epi32(127)), 23));
    const __m256 y = _mm256_mul_ps(_mm256_mul_ps(exp_reduced(x, n).x, p1), p2);
    return _mm256_andnot_ps(_mm256_cmp_ps(a.x, lo, _CMP_LT_OQ), y);   // x < -87.34 (or -inf): 0
  }
  static void widen(const uint16_t* src, float* dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_slli_epi32(w, 16));
    }
    for (; i < n; ++i) {
      const uint32_t b = uint32_t(src[i]) << 16;
      __builtin_memcpy(dst + i, &b, 4);
    }
  }
};

// (free functions: gcc does not apply the target pragma to friends defined inside the class)
inline V operator+(V a, V b) { return _mm256_add_ps(a.x, b.x); }
inline V operator-(V a, V b) { return _mm256_sub_ps(a.x, b.x); }
inline V operator*(V a, V b) { return _mm256_mul_ps(a.x, b.x); }

#include "reduce_impl.h"

const growmem::Isa kIsa = {"avx2", V::W, &Impl<V>::scratch_floats, &Impl<V>::fwd_part, &Impl<V>::bwd_part};

}  // namespace

#pragma GCC pop_options

const growmem::Isa* growmem::isa_avx2() { return &kIsa; }

#else
const growmem::Isa* growmem::isa_avx2() { return nullptr; }
#endif
