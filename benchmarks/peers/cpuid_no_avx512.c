// LD_PRELOAD shim for benchmarks/avx2_proxy.py: CPUID without AVX-512, AVX-VNNI or AMX, so code that
// picks its kernels by CPUID at run time (onnxruntime's MLAS, libgcc's __builtin_cpu_supports,
// numpy) takes its AVX2 paths on a wider CPU. Uses Linux's CPUID faulting (arch_prctl
// ARCH_SET_CPUID; /proc/cpuinfo lists cpuid_fault): each cpuid instruction traps into the SIGSEGV
// handler, which runs the real one with faulting off and clears the bits. Code compiled for
// AVX-512 outright (llama.cpp's native build, glibc's string functions picked before this loads)
// is not affected. Leaf 7: EBX avx512 f/dq/ifma/pf/er/cd/bw/vl, ECX vbmi/vbmi2/vnni/bitalg/
// vpopcntdq, EDX vp2intersect/amx-bf16/avx512-fp16/amx-tile/amx-int8; leaf 7.1: EAX avx-vnni,
// avx512-bf16.
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static long set_cpuid(unsigned long on) { return syscall(SYS_arch_prctl, ARCH_SET_CPUID, on); }
static struct sigaction previous;

static void on_segv(int sig, siginfo_t* info, void* context) {
  ucontext_t* uc = context;
  greg_t* r = uc->uc_mcontext.gregs;
  const unsigned char* ip = (const unsigned char*)r[REG_RIP];
  if (ip[0] != 0x0f || ip[1] != 0xa2) {  // not cpuid: the previous handler, or the default
    sigaction(SIGSEGV, &previous, NULL);
    return;  // the faulting instruction runs again and takes that path
  }
  unsigned int a = (unsigned int)r[REG_RAX], c = (unsigned int)r[REG_RCX], b, d;
  const unsigned int leaf = a, sub = c;
  set_cpuid(1);
  __asm__ volatile("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
  set_cpuid(0);
  if (leaf == 7 && sub == 0) {
    b &= ~((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) | (1u << 30) | (1u << 31));
    c &= ~((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14));
    d &= ~((1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) | (1u << 25));
  } else if (leaf == 7 && sub == 1) {
    a &= ~((1u << 4) | (1u << 5));  // AVX-VNNI, AVX512_BF16
  }
  r[REG_RAX] = a, r[REG_RBX] = b, r[REG_RCX] = c, r[REG_RDX] = d;
  r[REG_RIP] += 2;
  (void)sig, (void)info;
}

__attribute__((constructor(101))) static void hide_avx512(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigaction(SIGSEGV, &sa, &previous);
  if (set_cpuid(0) != 0) perror("cpuid_mask: arch_prctl(ARCH_SET_CPUID)");
}
