// Portable bodies of the native kernel (any CPU the compiler targets): W = 8 lanes as plain arrays,
// left to the compiler's vectoriser. The fallback where neither AVX-512 nor AVX2 is present.
#include <cmath>
#include <cstring>

#include "isa.h"

namespace {

struct V {
  static constexpr int W = 8;
  static constexpr int RA = 4;  // rows per score pass
  static constexpr int UA = 1;  // columns per iteration of a score pass: RA x UA accumulators
  static constexpr int JB = 8;
  float x[W];
  static V zero() { return set1(0.0f); }
  static V set1(float a) {
    V r;
    for (int l = 0; l < W; ++l) r.x[l] = a;
    return r;
  }
  static V load(const float* p) {
    V r;
    std::memcpy(r.x, p, sizeof r.x);
    return r;
  }
  void store(float* p) const { std::memcpy(p, x, sizeof x); }
  static V load_n(const float* p, int n) {
    V r = zero();
    std::memcpy(r.x, p, sizeof(float) * n);
    return r;
  }
  void store_n(float* p, int n) const { std::memcpy(p, x, sizeof(float) * n); }
  static V keep(V a, int n) {
    for (int l = n; l < W; ++l) a.x[l] = 0.0f;
    return a;
  }
  template <class F>
  static V map2(V a, V b, F f) {
    V r;
    for (int l = 0; l < W; ++l) r.x[l] = f(a.x[l], b.x[l]);
    return r;
  }
  static V fma(V a, V b, V c) {
    V r;
    for (int l = 0; l < W; ++l) r.x[l] = a.x[l] * b.x[l] + c.x[l];   // contracted where the target has FMA
    return r;
  }
  friend V operator+(V a, V b) { return map2(a, b, [](float u, float v) { return u + v; }); }
  friend V operator-(V a, V b) { return map2(a, b, [](float u, float v) { return u - v; }); }
  friend V operator*(V a, V b) { return map2(a, b, [](float u, float v) { return u * v; }); }
  // as the x86 instructions: the second operand when either is NaN
  static V max(V a, V b) { return map2(a, b, [](float u, float v) { return u > v ? u : v; }); }
  static V min(V a, V b) { return map2(a, b, [](float u, float v) { return u < v ? u : v; }); }
  static float sum(V a) {
    float s = 0.0f;
    for (int l = 0; l < W; ++l) s += a.x[l];
    return s;
  }
  static bool any_gt(V a, V b) {
    for (int l = 0; l < W; ++l)
      if (a.x[l] > b.x[l]) return true;
    return false;
  }
  static V exp(V a) {
    V r;
    for (int l = 0; l < W; ++l) r.x[l] = std::exp(a.x[l]);
    return r;
  }
  static void widen(const uint16_t* src, float* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t b = uint32_t(src[i]) << 16;
      std::memcpy(dst + i, &b, 4);
    }
  }
};

#include "reduce_impl.h"

const growmem::Isa kIsa = {"generic", V::W, &Impl<V>::scratch_floats, &Impl<V>::fwd_part, &Impl<V>::bwd_part};

}  // namespace

const growmem::Isa* growmem::isa_generic() { return &kIsa; }
