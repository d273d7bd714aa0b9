// This host's float32 FMA peak, the ceiling for a GEMM's GFLOP/s: 12 independent AVX-512 accumulators
// per thread (more than an FMA's latency x its pipes), one thread per core. Needs AVX-512F.
//   gcc -O2 -mavx512f -mfma -pthread experiments/fma_peak.c -o /tmp/fma_peak && /tmp/fma_peak 2
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <time.h>
#define ITERS 4800000000L
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void* run(void* arg){
  volatile float v=1.0f; __m512 a0=_mm512_set1_ps(v),a1=_mm512_set1_ps(v+1),a2=_mm512_set1_ps(v+2),a3=_mm512_set1_ps(v+3),a4=_mm512_set1_ps(v+4),a5=_mm512_set1_ps(v+5),a6=_mm512_set1_ps(v+6),a7=_mm512_set1_ps(v+7),a8=_mm512_set1_ps(v+8),a9=_mm512_set1_ps(v+9),a10=_mm512_set1_ps(v+10),a11=_mm512_set1_ps(v+11);
  __m512 x=_mm512_set1_ps(0.999999f), y=_mm512_set1_ps(1e-7f);
  for(long i=0;i<ITERS/12;i++){
    a0=_mm512_fmadd_ps(a0,x,y);a1=_mm512_fmadd_ps(a1,x,y);a2=_mm512_fmadd_ps(a2,x,y);a3=_mm512_fmadd_ps(a3,x,y);
    a4=_mm512_fmadd_ps(a4,x,y);a5=_mm512_fmadd_ps(a5,x,y);a6=_mm512_fmadd_ps(a6,x,y);a7=_mm512_fmadd_ps(a7,x,y);
    a8=_mm512_fmadd_ps(a8,x,y);a9=_mm512_fmadd_ps(a9,x,y);a10=_mm512_fmadd_ps(a10,x,y);a11=_mm512_fmadd_ps(a11,x,y);
  }
  __m512 s=_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0,a1),_mm512_add_ps(a2,a3)),_mm512_add_ps(_mm512_add_ps(a4,a5),_mm512_add_ps(a6,a7)));
  s=_mm512_add_ps(s,_mm512_add_ps(_mm512_add_ps(a8,a9),_mm512_add_ps(a10,a11)));
  *(float*)arg=_mm512_reduce_add_ps(s); return NULL;
}
int main(int argc,char**argv){
  int n=argc>1?atoi(argv[1]):2; pthread_t t[64]; float out[64];
  double t0=now(); for(int i=0;i<n;i++) pthread_create(&t[i],0,run,&out[i]); for(int i=0;i<n;i++) pthread_join(t[i],0);
  double dt=now()-t0; double flops=(double)n*(ITERS/12)*12*16*2;
  printf("%d threads: %.1f GFLOP/s fp32 FMA (%.3f s, checksum %g)\n",n,flops/dt/1e9,dt,out[0]);
}
