// AVX-512 (F, BW, DQ, VL) bodies of the native kernel: W = 16 query lanes per vector.
#include "isa.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,bmi,bmi2")
// gcc 12 warns on the deliberately undefined operands inside its own AVX-512 intrinsics
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace {

#include "exp_poly.h"

struct V {
  static constexpr int W = 16;
  static constexpr int RA = 8;  // rows per score pass
  static constexpr int UA = 2;  // columns per iteration of a score pass: RA x UA accumulators
  static constexpr int JB = 24;  // columns per accumulation pass: 24 accumulators + the row's weights
  __m512 x;
  V() = default;
  V(__m512 a) : x(a) {}
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float a) { return _mm512_set1_ps(a); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  void store(float* p) const { _mm512_storeu_ps(p, x); }
  static __mmask16 first(int n) { return __mmask16((1u << n) - 1u); }
  static V load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(first(n), p); }
  void store_n(float* p, int n) const { _mm512_mask_storeu_ps(p, first(n), x); }
  static V keep(V a, int n) { return n == W ? a : V(_mm512_maskz_mov_ps(first(n), a.x)); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a.x, b.x, c.x); }
  // NaN in b propagates (x86 max/min return the second operand when either is NaN)
  static V max(V a, V b) { return _mm512_max_ps(a.x, b.x); }
  static V min(V a, V b) { return _mm512_min_ps(a.x, b.x); }
  static float sum(V a) { return _mm512_reduce_add_ps(a.x); }
  static bool any_gt(V a, V b) { return _mm512_cmp_ps_mask(a.x, b.x, _CMP_GT_OQ) != 0; }
  // e^x: exp_reduced (exp_poly.h), then 2^n by scalef (exact underflow to 0 and overflow to inf); NaN
  // propagates (min/max return their second operand when either is NaN)
  static V exp(V a) {
    const V x = _mm512_max_ps(_mm512_set1_ps(-104.0f), _mm512_min_ps(_mm512_set1_ps(88.8f), a.x));
    const V n = _mm512_roundscale_ps(_mm512_mul_ps(x.x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm512_scalef_ps(exp_reduced(x, n).x, n.x);
  }
  static void widen(const uint16_t* src, float* dst, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i)));
      _mm512_storeu_si512(dst + i, _mm512_slli_epi32(w, 16));
    }
    for (; i < n; ++i) {
      const uint32_t b = uint32_t(src[i]) << 16;
      __builtin_memcpy(dst + i, &b, 4);
    }
  }
};

// (free functions: gcc does not apply the target pragma to friends defined inside the class)
inline V operator+(V a, V b) { return _mm512_add_ps(a.x, b.x); }
inline V operator-(V a, V b) { return _mm512_sub_ps(a.x, b.x); }
inline V operator*(V a, V b) { return _mm512_mul_ps(a.x, b.x); }

#include "reduce_impl.h"

const growmem::Isa kIsa = {"avx512", V::W, &Impl<V>::scratch_floats, &Impl<V>::fwd_part, &Impl<V>::bwd_part};

}  // namespace

#pragma GCC pop_options

const growmem::Isa* growmem::isa_avx512() { return &kIsa; }

#else
const growmem::Isa* growmem::isa_avx512() { return nullptr; }
#endif
