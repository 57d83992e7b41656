// Keeps a wheel built on a new Linux within manylinux_2_28 (glibc 2.28): compiled into setuptools
// builds on glibc systems only (setup.py), not into the JIT or CMake builds, which run where built.
//
// With glibc >= 2.32 headers, libstdc++'s reference counting (shared_ptr, c10 intrusive pointers
// go through it too) reads glibc's `__libc_single_threaded` (GLIBC_2.32) to skip atomics in
// single-threaded processes. Defining a hidden variable of that name here binds those reads to it
// at link time, so the binary needs no GLIBC_2.32 symbol. It is 0 ("not single-threaded"): the
// atomic path is always taken, which is correct in every process. Built on glibc 2.28 itself
// (the manylinux_2_28 image) nothing refers to it and it is unused.
extern "C" {
__attribute__((visibility("hidden"))) char __libc_single_threaded = 0;
}

// The CUDA runtime is linked statically (_build_support.py: STATIC_CUDA_RUNTIME), and glibc 2.34 moved
// the thread, semaphore, shared-memory and dl functions it calls into libc under version GLIBC_2.34:
// linked on such a glibc, its references would bind to those. The link wraps each of them (--wrap,
// _build_support.static_cuda_runtime_glibc_wraps), and the wrappers below jump to the version every
// glibc since 2.28 still exports: the same functions.
#if defined(__x86_64__)  // setup.py compiles this file on glibc systems only
#define EDSC_EXT_GLIBC_VERSIONED(name, version)                  \
  __asm__(".symver edsc_ext_glibc_" #name ", " #name "@" version \
          "\n"                                                   \
          ".globl __wrap_" #name                                 \
          "\n"                                                   \
          ".hidden __wrap_" #name                                \
          "\n"                                                   \
          ".type __wrap_" #name                                  \
          ", @function\n"                                        \
          "__wrap_" #name                                        \
          ":\n"                                                  \
          "  jmp edsc_ext_glibc_" #name "@PLT\n");
#define EDSC_EXT_GLIBC_225(name) EDSC_EXT_GLIBC_VERSIONED(name, "GLIBC_2.2.5")
#include "static_cuda_runtime_glibc.def"
#undef EDSC_EXT_GLIBC_225
#undef EDSC_EXT_GLIBC_VERSIONED
#endif
