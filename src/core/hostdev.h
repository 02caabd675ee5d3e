/* SPDX-License-Identifier: MIT */
/* The qualifiers of code compiled for host and device alike. Only the core
 * (src/core/) asks which compiler it is under: the rest of the tree is C11, or
 * CUDA that includes these headers.
 *
 *   MS_HOSTDEV      a function the host and the device both call
 *   MS_CORE_DEV     a small function of the device's path (forced inline
 *                   there), static inline on the host */
#ifndef MS_CORE_HOSTDEV_H
#define MS_CORE_HOSTDEV_H

#ifdef __CUDACC__
#define MS_HOSTDEV __host__ __device__
#define MS_CORE_DEV static __device__ __forceinline__
#else
#define MS_HOSTDEV
#define MS_CORE_DEV static inline
#endif

#endif
