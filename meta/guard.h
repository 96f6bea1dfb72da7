/* SPDX-License-Identifier: MIT */
/*
 * Copies into and out of memory a client owns (its shm objects), guarded
 * against SIGBUS: a client can shrink its object while the daemon copies,
 * and that must cost the request an error, not the daemon its life.
 *
 * The first call installs a process-wide SIGBUS handler. A fault inside a
 * guarded copy on the faulting thread jumps back and the call returns
 * -EFAULT; any other SIGBUS gets the default action.
 *
 * Thread-safe; each thread has its own guard.
 */
#ifndef KVFS_META_GUARD_H
#define KVFS_META_GUARD_H

#include <stddef.h>
#include <stdint.h>

/* memcpy(@dst, @src, @len). 0 or -EFAULT (a guarded page vanished). */
int kvfs_guard_memcpy(void *dst, const void *src, size_t len);
/* *@crc = kvfs_fmt_crc32c(*@crc, @src, @len) (meta/fmt.h): a checksum of
 * bytes a client owns. 0 or -EFAULT (*@crc then undefined).
 */
int kvfs_guard_crc32c(uint32_t *crc, const void *src, size_t len);
/* Release-store @v to *@p. 0 or -EFAULT. */
int kvfs_guard_store_u32(uint32_t *p, uint32_t v);

#endif
