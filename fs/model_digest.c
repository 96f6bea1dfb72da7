/* SPDX-License-Identifier: MIT */
/*
 * The checkpoint fingerprint behind model_digest = auto (fs/model_digest.h
 * says what is hashed, and why not everything).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "fs/model_digest.h"

#define SAMPLE (1u << 20) /* bytes of tensor data hashed at each end */
#define HEADER_MAX (100u << 20) /* the safetensors format's own limit */
#define INDEX_MAX (64u << 20)
#define SHARDS_MAX 4096

struct digest {
	EVP_MD_CTX *md;
	char *why;
	size_t whylen;
};

/* Say "@what: @detail" (or @what alone) and return @err. */
static int why(struct digest *d, int err, const char *what, const char *detail)
{
	snprintf(d->why, d->whylen, "%s%s%s", what, detail[0] ? ": " : "",
		 detail);
	return err;
}

/* Hash @len bytes of @fd from @off. */
static int hash_range(struct digest *d, int fd, const char *path, uint64_t off,
		      uint64_t len)
{
	static __thread uint8_t buf[1 << 16];

	while (len) {
		size_t n = len < sizeof(buf) ? (size_t)len : sizeof(buf);
		ssize_t got = pread(fd, buf, n, (off_t)off);

		if (got <= 0)
			return why(d, got ? -errno : -EIO, path,
				   got ? strerror(errno) : "file too short");
		if (!EVP_DigestUpdate(d->md, buf, (size_t)got))
			return why(d, -EIO, path, "SHA-256 failed");
		off += (uint64_t)got;
		len -= (uint64_t)got;
	}
	return 0;
}

static int hash_shard(struct digest *d, const char *path)
{
	const char *base = strrchr(path, '/');
	uint8_t hl[8];
	uint64_t hlen = 0, data, dlen;
	struct stat sb;
	int fd, rc;

	base = base ? base + 1 : path;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return why(d, -errno, path, strerror(errno));
	rc = fstat(fd, &sb) ? -errno : 0;
	if (!rc && pread(fd, hl, 8, 0) != 8)
		rc = -EINVAL;
	for (int i = 7; !rc && i >= 0; i--)
		hlen = hlen << 8 | hl[i];
	if (!rc &&
	    (hlen < 2 || hlen > HEADER_MAX || 8 + hlen > (uint64_t)sb.st_size))
		rc = -EINVAL;
	if (rc) {
		close(fd);
		return why(d, rc, path,
			   rc == -EINVAL ? "not a safetensors file" :
					   strerror(-rc));
	}
	if (!EVP_DigestUpdate(d->md, base, strlen(base) + 1)) {
		close(fd);
		return why(d, -EIO, path, "SHA-256 failed");
	}
	data = 8 + hlen;
	dlen = (uint64_t)sb.st_size - data;
	rc = hash_range(d, fd, path, 0, data);
	if (!rc)
		rc = hash_range(d, fd, path, data,
				dlen < SAMPLE ? dlen : SAMPLE);
	if (!rc && dlen > SAMPLE) {
		uint64_t tail = dlen - SAMPLE < SAMPLE ? dlen - SAMPLE : SAMPLE;

		rc = hash_range(d, fd, path, (uint64_t)sb.st_size - tail, tail);
	}
	close(fd);
	return rc;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/*
 * The shards an index names: every JSON string value ending in
 * ".safetensors" (the values of its weight_map), each once, sorted.
 */
static int index_shards(struct digest *d, const char *path, const char *text,
			char ***out, size_t *n_out)
{
	char **v = NULL;
	size_t n = 0;

	for (const char *p = strchr(text, '"'); p; p = strchr(p + 1, '"')) {
		const char *end = strchr(p + 1, '"');
		size_t len;

		if (!end)
			break;
		len = (size_t)(end - p - 1);
		if (len > 12 && !memcmp(end - 12, ".safetensors", 12) &&
		    !memchr(p + 1, '\\', len)) {
			if (n == SHARDS_MAX)
				goto out_fail;
			char **nv = realloc(v, (n + 1) * sizeof(*v));

			if (!nv || !(nv[n] = strndup(p + 1, len))) {
				v = nv ? nv : v;
				goto out_fail;
			}
			v = nv;
			n++;
		}
		p = end;
	}
	if (!n) {
		free(v);
		return why(d, -EINVAL, path, "names no .safetensors shard");
	}
	qsort(v, n, sizeof(*v), cmp_str);
	*out = v;
	*n_out = n;
	return 0;
out_fail:
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
	return why(d, -ENOMEM, path, "too many shards or no memory");
}

static int hash_index(struct digest *d, const char *path)
{
	char dir[4096], shard[4096 + 256], **v = NULL;
	const char *slash = strrchr(path, '/');
	size_t n = 0;
	struct stat sb;
	char *text;
	int fd, rc;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return why(d, -errno, path, strerror(errno));
	if (fstat(fd, &sb) || sb.st_size <= 0 || sb.st_size > INDEX_MAX) {
		close(fd);
		return why(d, -EINVAL, path, "not an index of a sensible size");
	}
	text = calloc(1, (size_t)sb.st_size + 1);
	rc = text ? hash_range(d, fd, path, 0, (uint64_t)sb.st_size) : -ENOMEM;
	if (!rc && pread(fd, text, (size_t)sb.st_size, 0) != sb.st_size)
		rc = why(d, -EIO, path, "short read");
	close(fd);
	if (!rc)
		rc = index_shards(d, path, text, &v, &n);
	free(text);
	snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - path) : 1,
		 slash ? path : ".");
	for (size_t i = 0; !rc && i < n; i++) {
		/* Once each: sorted, so a repeat is the previous name. */
		if (i && !strcmp(v[i], v[i - 1]))
			continue;
		snprintf(shard, sizeof(shard), "%s/%s", dir, v[i]);
		rc = hash_shard(d, shard);
	}
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
	return rc;
}

int kvfs_model_digest(const char *weights, char out[65], char *whybuf,
		      size_t whylen)
{
	struct digest d = { .why = whybuf, .whylen = whylen };
	size_t len = strlen(weights);
	unsigned char md[EVP_MAX_MD_SIZE];
	unsigned mdlen = 0;
	int rc;

	whybuf[0] = 0;
	d.md = EVP_MD_CTX_new();
	if (!d.md || !EVP_DigestInit_ex(d.md, EVP_sha256(), NULL)) {
		EVP_MD_CTX_free(d.md);
		return why(&d, -ENOMEM, "cannot start SHA-256", "");
	}
	if (len > 5 && !strcmp(weights + len - 5, ".json"))
		rc = hash_index(&d, weights);
	else
		rc = hash_shard(&d, weights);
	if (!rc && (!EVP_DigestFinal_ex(d.md, md, &mdlen) || mdlen != 32))
		rc = why(&d, -EIO, "SHA-256 failed", "");
	EVP_MD_CTX_free(d.md);
	if (rc)
		return rc;
	for (unsigned i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", md[i]);
	return 0;
}
