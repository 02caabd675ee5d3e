/* SPDX-License-Identifier: MIT */
/* One vocabulary of atomics and plain memory moves, compiled both as C11 (C
 * builtins) and as CUDA (PTX acquire/release at GPU scope, intrinsics): the
 * reference maps (maps.c, through map_core.h), the device interpreter
 * (src/core/bpf_core.h) and their tests say the same thing the same way.
 * Orders: loads acquire and stores release where a state word publishes what
 * it guards; counters relaxed (they order nothing); a CAS acq_rel on success,
 * acquire on failure; 8-byte value words relaxed so no reader sees a torn
 * counter. */
#ifndef MS_CORE_ATOMICS_H
#define MS_CORE_ATOMICS_H

#include <stdint.h>

#include "core/hostdev.h"

#define MS_AT_FN MS_CORE_DEV

#ifdef __CUDACC__
MS_AT_FN uint32_t ms_at_ld_acq32(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
MS_AT_FN void ms_at_st_rel32(uint32_t *p, uint32_t v) {
  asm volatile("st.release.gpu.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
MS_AT_FN uint64_t ms_at_ld_acq64(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
MS_AT_FN void ms_at_st_rel64(uint64_t *p, uint64_t v) {
  asm volatile("st.release.gpu.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
MS_AT_FN uint64_t ms_at_ld_rlx64(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.relaxed.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
MS_AT_FN void ms_at_st_rlx64(uint64_t *p, uint64_t v) {
  asm volatile("st.relaxed.gpu.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
MS_AT_FN void ms_at_st_rlx8(uint8_t *p, uint8_t v) { *(volatile uint8_t *)p = v; }
MS_AT_FN uint32_t ms_at_ld_rlx32(const uint32_t *p) { return *(const volatile uint32_t *)p; }
MS_AT_FN void ms_at_st_rlx32(uint32_t *p, uint32_t v) { *(volatile uint32_t *)p = v; }
MS_AT_FN uint64_t ms_at_add_acq_rel64(uint64_t *p, uint64_t v) {
  uint64_t old;
  asm volatile("atom.acq_rel.gpu.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
  return old;
}
MS_AT_FN void ms_at_fence_acq_rel(void) { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }
/* CAS with acq_rel on success, acquire on failure; *expected gets the old value. */
MS_AT_FN int ms_at_cas32(uint32_t *p, uint32_t *expected, uint32_t desired) {
  __threadfence();
  uint32_t old = atomicCAS((unsigned int *)p, *expected, desired);
  __threadfence();
  int ok = old == *expected;
  *expected = old;
  return ok;
}
MS_AT_FN uint64_t ms_at_fetch_add64(uint64_t *p, uint64_t v) {
  return atomicAdd((unsigned long long *)p, (unsigned long long)v); /* relaxed: counts order nothing */
}
MS_AT_FN uint32_t ms_at_xchg32_acq(uint32_t *p, uint32_t v) {
  uint32_t old = atomicExch((unsigned int *)p, v);
  __threadfence(); /* acquire: the lock holder's writes before ours */
  return old;
}
MS_AT_FN void ms_at_relax(void) { __nanosleep(32); }
MS_AT_FN uint64_t ms_at_clock_now(void) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
MS_AT_FN int ms_at_clz64(uint64_t v) { return __clzll((long long)v); }
#else
MS_AT_FN uint32_t ms_at_ld_acq32(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
MS_AT_FN void ms_at_st_rel32(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
MS_AT_FN uint64_t ms_at_ld_acq64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
MS_AT_FN void ms_at_st_rel64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
MS_AT_FN uint64_t ms_at_ld_rlx64(const uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
MS_AT_FN void ms_at_st_rlx64(uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
MS_AT_FN void ms_at_st_rlx8(uint8_t *p, uint8_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
MS_AT_FN uint32_t ms_at_ld_rlx32(const uint32_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
MS_AT_FN void ms_at_st_rlx32(uint32_t *p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
MS_AT_FN uint64_t ms_at_add_acq_rel64(uint64_t *p, uint64_t v) { return __atomic_fetch_add(p, v, __ATOMIC_ACQ_REL); }
/* ThreadSanitizer does not model stand-alone fences (gcc warns, and -Werror
 * stops the build): there a seq_cst read-modify-write stands in. */
#if defined(__SANITIZE_THREAD__)
static int ms_at_fence_word;
MS_AT_FN void ms_at_fence_acq_rel(void) { (void)__atomic_fetch_add(&ms_at_fence_word, 0, __ATOMIC_SEQ_CST); }
#else
MS_AT_FN void ms_at_fence_acq_rel(void) { __atomic_thread_fence(__ATOMIC_ACQ_REL); }
#endif
MS_AT_FN int ms_at_cas32(uint32_t *p, uint32_t *expected, uint32_t desired) {
  return __atomic_compare_exchange_n(p, expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}
MS_AT_FN uint64_t ms_at_fetch_add64(uint64_t *p, uint64_t v) {
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); /* relaxed: counts order nothing */
}
MS_AT_FN uint32_t ms_at_xchg32_acq(uint32_t *p, uint32_t v) {
  return __atomic_exchange_n(p, v, __ATOMIC_ACQUIRE);
}
MS_AT_FN void ms_at_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
MS_AT_FN int ms_at_clz64(uint64_t v) { return __builtin_clzll(v); }
#endif

/* ---- plain memory ------------------------------------------------------- */

MS_AT_FN uint64_t ms_at_load(const void *p, unsigned size) {
  const uint8_t *b = (const uint8_t *)p;
  if (((uintptr_t)p & (size - 1)) == 0) {
    switch (size) {
    case 1: return *b;
    case 2: return *(const uint16_t *)p;
    case 4: return *(const uint32_t *)p;
    default: return *(const uint64_t *)p;
    }
  }
  uint64_t v = 0;
  for (unsigned i = 0; i < size; i++) v |= (uint64_t)b[i] << (8 * i);
  return v;
}

MS_AT_FN void ms_at_store(void *p, unsigned size, uint64_t v) {
  uint8_t *b = (uint8_t *)p;
  if (((uintptr_t)p & (size - 1)) == 0) {
    switch (size) {
    case 1: *b = (uint8_t)v; return;
    case 2: *(uint16_t *)p = (uint16_t)v; return;
    case 4: *(uint32_t *)p = (uint32_t)v; return;
    default: *(uint64_t *)p = v; return;
    }
  }
  for (unsigned i = 0; i < size; i++) b[i] = (uint8_t)(v >> (8 * i));
}

MS_AT_FN void ms_at_bytes_copy(void *dst, const void *src, uint64_t n) {
  uint8_t *d = (uint8_t *)dst;
  const uint8_t *s = (const uint8_t *)src;
  for (uint64_t i = 0; i < n; i++) d[i] = s[i];
}

MS_AT_FN void ms_at_bytes_zero(void *dst, uint64_t n) {
  uint8_t *d = (uint8_t *)dst;
  for (uint64_t i = 0; i < n; i++) d[i] = 0;
}

/* A copy into a map's key or value slot: 8-byte words with relaxed atomic stores (dst is a
 * value or key slot, 8-aligned; src may be anywhere), then bytes. */
MS_AT_FN void ms_at_copy_in(void *dst, const void *src, uint64_t n) {
  uint8_t *d = (uint8_t *)dst;
  const uint8_t *s = (const uint8_t *)src;
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) ms_at_st_rlx64((uint64_t *)(d + i), ms_at_load(s + i, 8));
  for (; i < n; i++) ms_at_st_rlx8(d + i, s[i]);
}

/* Words another thread (another CTA) may read or write at the same time, of
 * any 4- or 8-byte type, with no ordering of their own (the fences around
 * them order them): relaxed atomics on the host, volatile accesses on the device. */
#ifdef __CUDACC__
MS_AT_FN uint32_t ms_at_word_ld32(const void *p) { return *(const volatile uint32_t *)p; }
MS_AT_FN void ms_at_word_st32(void *p, uint32_t v) { *(volatile uint32_t *)p = v; }
MS_AT_FN uint64_t ms_at_word_ld64(const void *p) { return *(const volatile uint64_t *)p; }
MS_AT_FN void ms_at_word_st64(void *p, uint64_t v) { *(volatile uint64_t *)p = v; }
#else
MS_AT_FN uint32_t ms_at_word_ld32(const void *p) { return __atomic_load_n((const uint32_t *)p, __ATOMIC_RELAXED); }
MS_AT_FN void ms_at_word_st32(void *p, uint32_t v) { __atomic_store_n((uint32_t *)p, v, __ATOMIC_RELAXED); }
MS_AT_FN uint64_t ms_at_word_ld64(const void *p) { return __atomic_load_n((const uint64_t *)p, __ATOMIC_RELAXED); }
MS_AT_FN void ms_at_word_st64(void *p, uint64_t v) { __atomic_store_n((uint64_t *)p, v, __ATOMIC_RELAXED); }
#endif

#endif
