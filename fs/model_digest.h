/* SPDX-License-Identifier: MIT */
/*
 * model_digest = auto (docs/config.md): a fingerprint of a checkpoint,
 * cheap enough to compute at every start and stable across starts and
 * hosts, mixed into a namespace's root key so that KV made by another
 * checkpoint under the same name is never served.
 *
 * It is the lowercase hex SHA-256 over, for each .safetensors file (the
 * file @weights names, or every shard a sharded checkpoint's index names,
 * in sorted order): the file's name without its directory, its 8-byte
 * header length and JSON header (tensor names, dtypes, shapes, offsets),
 * and the first and last MiB of its tensor data (a fine-tune of the same
 * architecture has the same header, never the same weights). For an index
 * the index file's bytes come first. Not the whole checkpoint: reading
 * every weight at each start would take minutes.
 */
#ifndef KVFS_FS_MODEL_DIGEST_H
#define KVFS_FS_MODEL_DIGEST_H

#include <stddef.h>

/*
 * kvfs_model_digest() - the fingerprint of the checkpoint @weights (a
 * .safetensors file or a model.safetensors.index.json) into @out (64 hex
 * characters and a NUL).
 * Returns 0, or -errno with @why (@whylen bytes) saying what was wrong: a
 * file that cannot be read, a header that is not a safetensors header,
 * an index that names no shard. No locks; reads the files.
 */
int kvfs_model_digest(const char *weights, char out[65], char *why,
		      size_t whylen);

#endif
