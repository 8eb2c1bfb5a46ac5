#include <immintrin.h>
#include <chrono>
#include <cstdio>
__attribute__((target("avx512f,avx512bf16"))) float run_dots(long n) {
  __m512 acc[16]; for (int i=0;i<16;++i) acc[i]=_mm512_setzero_ps();
  __m512i a=_mm512_set1_epi32(0x3f803f80), b=_mm512_set1_epi32(0x3f803f80);
  __m512bh x, y; __builtin_memcpy(&x,&a,64); __builtin_memcpy(&y,&b,64);
  for (long k=0;k<n;++k) {
    _Pragma("GCC unroll 16") for (int i=0;i<16;++i) { acc[i]=_mm512_dpbf16_ps(acc[i],x,y); }

  }
  float s=0; for (int i=0;i<16;++i) s+=_mm512_reduce_add_ps(acc[i]); return s;
}
__attribute__((target("avx512f,fma"))) float run_fma(long n) {
  __m512 acc[16]; for (int i=0;i<16;++i) acc[i]=_mm512_setzero_ps();
  __m512 x=_mm512_set1_ps(1.0f), y=_mm512_set1_ps(1e-9f);
  for (long k=0;k<n;++k) {
    _Pragma("GCC unroll 16") for (int i=0;i<16;++i) acc[i]=_mm512_fmadd_ps(x,y,acc[i]);

  }
  float s=0; for (int i=0;i<16;++i) s+=_mm512_reduce_add_ps(acc[i]); return s;
}
// Instruction rates on one core: 16 independent float32 FMAs against 16 independent vdpbf16ps.
//   g++ -O3 -o /tmp/dot_rates benchmarks/native/dot_rates.cpp && /tmp/dot_rates
int main(){ long n=100000000;
 for (int r=0;r<2;++r){
 auto t0=std::chrono::steady_clock::now(); float a=run_fma(n); auto t1=std::chrono::steady_clock::now(); float b=run_dots(n); auto t2=std::chrono::steady_clock::now();
 double f=std::chrono::duration<double>(t1-t0).count(), d=std::chrono::duration<double>(t2-t1).count();
 printf("fma: %.1f Ginstr/s = %.0f GFLOP/s | dpbf16: %.1f Ginstr/s = %.0f GFLOP/s (%g %g)\n", 16*n/f/1e9, 16*n/f/1e9*32, 16*n/d/1e9, 16*n/d/1e9*64, a, b);}
}
