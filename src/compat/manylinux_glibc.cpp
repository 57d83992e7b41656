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
