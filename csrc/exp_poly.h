// Included by isa_avx512.cc and isa_avx2.cc inside their anonymous namespace and target pragma (so
// that it is compiled for that instruction set and inlined): the common part of their V::exp.
#pragma once

// e^r on |r| <= ln2 / 2 from x = n ln 2 + r (Cody-Waite: ln 2 in two parts), a degree-6 polynomial
// (Cephes expf); the instruction sets' V::exp clamp x, round n and scale by 2^n. V supplies fma, set1,
// and the + and * operators.
template <class V>
inline V exp_reduced(V x, V n) {
  V r = V::fma(n, V::set1(-0.693359375f), x);
  r = V::fma(n, V::set1(2.12194440e-4f), r);
  V p = V::set1(1.9875691500e-4f);
  p = V::fma(p, r, V::set1(1.3981999507e-3f));
  p = V::fma(p, r, V::set1(8.3334519073e-3f));
  p = V::fma(p, r, V::set1(4.1665795894e-2f));
  p = V::fma(p, r, V::set1(1.6666665459e-1f));
  p = V::fma(p, r, V::set1(5.0000001201e-1f));
  return V::fma(p, r * r, r + V::set1(1.0f));
}

