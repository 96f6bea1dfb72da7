/* SPDX-License-Identifier: MIT */
/*
 * Fleet sightings (tier/sight.h): the wire format (a round trip, every
 * malformation rejected with its errno, random bytes never accepted), the
 * in-process bus (instances on one channel hear each other and not
 * themselves, another channel hears nothing, large batches split, a full
 * buffer drops and counts, garbage is rejected and never delivered, free
 * publishes what is pending, the sender publishes by itself), and the
 * redis backend with no server (new succeeds, a flush fails and counts
 * the batch lost).
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "meta/fmt.h"
#include "meta/util.h"
#include "tier/sight.h"

#define HS sizeof(struct kvfs_sight_hdr)

/* What one instance was delivered. */
struct heard {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	size_t calls;
	size_t n;
	uint8_t keys[2 * KVFS_SIGHT_MSG_KEYS][KVFS_KEY_LEN];
};

static void heard_init(struct heard *h)
{
	memset(h, 0, sizeof(*h));
	pthread_mutex_init(&h->lock, NULL);
	pthread_cond_init(&h->cond, NULL);
}

static void heard_fini(struct heard *h)
{
	pthread_mutex_destroy(&h->lock);
	pthread_cond_destroy(&h->cond);
}

static void on_keys(void *arg, const uint8_t (*keys)[KVFS_KEY_LEN], size_t n)
{
	struct heard *h = arg;

	pthread_mutex_lock(&h->lock);
	h->calls++;
	for (size_t i = 0; i < n; i++)
		if (h->n < sizeof(h->keys) / KVFS_KEY_LEN)
			memcpy(h->keys[h->n++], keys[i], KVFS_KEY_LEN);
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
}

static void key_of(uint32_t i, uint8_t key[KVFS_KEY_LEN])
{
	for (int b = 0; b < KVFS_KEY_LEN; b++)
		key[b] = (uint8_t)(i * 131 + (uint32_t)b * 7 + (i >> 8));
	kvfs_util_put32(key, i);
}

static struct kvfs_sight *open_mem(const char *chan, unsigned buffer,
				   struct heard *h)
{
	struct kvfs_sight_conf c;
	struct kvfs_sight *s = NULL;

	kvfs_sight_conf_defaults(&c);
	c.backend = KVFS_SIGHT_MEMORY;
	snprintf(c.channel, sizeof(c.channel), "%s", chan);
	/* The tests flush by hand; the sender must not beat them to it. */
	c.interval_ms = 3600 * 1000;
	if (buffer)
		c.buffer = buffer;
	assert_int_equal(kvfs_sight_new(&c, on_keys, h, &s), 0);
	assert_non_null(s);
	return s;
}

static struct kvfs_sight_stats stats_of(struct kvfs_sight *s)
{
	struct kvfs_sight_stats st;

	kvfs_sight_stats(s, &st);
	return st;
}

/* ---- the wire format ---- */

static void test_roundtrip(void **state)
{
	static uint8_t keys[KVFS_SIGHT_MSG_KEYS + 1][KVFS_KEY_LEN];
	static uint8_t buf[KVFS_SIGHT_MSG_MAX + 16];
	const uint8_t(*got)[KVFS_KEY_LEN];
	const size_t sizes[] = { 0, 1, 3, KVFS_SIGHT_MSG_KEYS };
	uint64_t host;
	size_t n;

	for (uint32_t i = 0; i <= KVFS_SIGHT_MSG_KEYS; i++)
		key_of(i, keys[i]);
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		int len =
			kvfs_sight_encode(0x0123456789abcdefull,
					  (const uint8_t(*)[KVFS_KEY_LEN])keys,
					  sizes[k], buf, sizeof(buf));

		assert_int_equal(len, (int)(HS + sizes[k] * KVFS_KEY_LEN));
		assert_int_equal(kvfs_sight_decode(buf, (size_t)len, &host,
						   &got, &n, NULL),
				 0);
		assert_true(host == 0x0123456789abcdefull);
		assert_int_equal(n, sizes[k]);
		if (n)
			assert_memory_equal(got, keys, n * KVFS_KEY_LEN);
	}
	/* Explicitly little-endian, whatever the host's order. */
	kvfs_sight_encode(0x0102030405060708ull,
			  (const uint8_t(*)[KVFS_KEY_LEN])keys, 1, buf,
			  sizeof(buf));
	assert_memory_equal(buf, "KSGT\x01\x00\x18\x00", 8);
	assert_memory_equal(buf + 8, "\x08\x07\x06\x05\x04\x03\x02\x01", 8);
	assert_memory_equal(buf + 16, "\x01\x00\x00\x00", 4);
	assert_true(kvfs_util_get32(buf + 20) ==
		    kvfs_fmt_crc32c(0, keys, KVFS_KEY_LEN));
	assert_int_equal(
		kvfs_sight_encode(1, (const uint8_t(*)[KVFS_KEY_LEN])keys,
				  KVFS_SIGHT_MSG_KEYS + 1, buf, sizeof(buf)),
		-EINVAL);
	assert_int_equal(kvfs_sight_encode(1,
					   (const uint8_t(*)[KVFS_KEY_LEN])keys,
					   2, buf, HS + KVFS_KEY_LEN),
			 -ENOSPC);
}

/* @msg (@len bytes) is rejected with @err and a reason naming @why, and
 * nothing is written to the outputs.
 */
static void expect_bad(const uint8_t *msg, size_t len, int err, const char *why)
{
	const uint8_t(*keys)[KVFS_KEY_LEN] = (void *)0x1;
	uint64_t host = 42;
	size_t n = 42;
	const char *w = NULL;

	assert_int_equal(kvfs_sight_decode(msg, len, &host, &keys, &n, &w),
			 err);
	assert_non_null(w);
	assert_non_null(strstr(w, why));
	assert_true(host == 42 && n == 42 && keys == (void *)0x1);
}

static void test_malformed(void **state)
{
	uint8_t keys[3][KVFS_KEY_LEN], ok[HS + 3 * KVFS_KEY_LEN + 1],
		m[sizeof(ok)];
	size_t len;

	for (uint32_t i = 0; i < 3; i++)
		key_of(i, keys[i]);
	len = (size_t)kvfs_sight_encode(7, (const uint8_t(*)[KVFS_KEY_LEN])keys,
					3, ok, sizeof(ok));
	assert_int_equal(len, HS + 3 * KVFS_KEY_LEN);

	expect_bad(NULL, 0, -EINVAL, "shorter");
	expect_bad(ok, 0, -EINVAL, "shorter");
	expect_bad(ok, HS - 1, -EINVAL, "shorter");
	expect_bad(ok, len - 1, -EINVAL, "length");
	expect_bad(ok, HS, -EINVAL, "length");
	memcpy(m, ok, len);
	m[len] = 0;
	expect_bad(m, len + 1, -EINVAL, "length");

	memcpy(m, ok, len);
	m[0] ^= 1;
	expect_bad(m, len, -EINVAL, "magic");
	memcpy(m, ok, len);
	kvfs_util_put16(m + 4, KVFS_SIGHT_VERSION + 1);
	expect_bad(m, len, -EINVAL, "version");
	memcpy(m, ok, len);
	kvfs_util_put16(m + 6, HS + 8);
	expect_bad(m, len, -EINVAL, "header size");
	memcpy(m, ok, len);
	kvfs_util_put32(m + 16, KVFS_SIGHT_MSG_KEYS + 1);
	expect_bad(m, len, -EINVAL, "too many");
	memcpy(m, ok, len);
	kvfs_util_put32(m + 16, 0xffffffffu);
	expect_bad(m, len, -EINVAL, "too many");
	memcpy(m, ok, len);
	kvfs_util_put32(m + 16, 2);
	expect_bad(m, len, -EINVAL, "length");
	memcpy(m, ok, len);
	kvfs_util_put32(m + 16, 4);
	expect_bad(m, len, -EINVAL, "length");
	/* A key bit, or the CRC itself. */
	memcpy(m, ok, len);
	m[HS + 2 * KVFS_KEY_LEN + 5] ^= 0x10;
	expect_bad(m, len, -EBADMSG, "CRC");
	memcpy(m, ok, len);
	m[20] ^= 0x80;
	expect_bad(m, len, -EBADMSG, "CRC");
}

/* Random bytes: never accepted, never read past their end (ASan). Half
 * of them carry a valid header for a consistent count, so that the CRC
 * alone has to catch them.
 */
static void test_fuzz(void **state)
{
	const uint8_t(*keys)[KVFS_KEY_LEN];
	uint64_t host;
	size_t n;

	srand(12345);
	for (int it = 0; it < 200000; it++) {
		size_t len = (size_t)rand() % (HS + 8 * KVFS_KEY_LEN + 2);
		uint8_t *m = malloc(len ? len : 1);
		int rc;

		assert_non_null(m);
		for (size_t i = 0; i < len; i++)
			m[i] = (uint8_t)rand();
		if ((it & 1) && len >= HS) {
			kvfs_util_put32(m, KVFS_SIGHT_MAGIC);
			kvfs_util_put16(m + 4, KVFS_SIGHT_VERSION);
			kvfs_util_put16(m + 6, HS);
			kvfs_util_put32(m + 16,
					(uint32_t)((len - HS) / KVFS_KEY_LEN));
		}
		rc = kvfs_sight_decode(m, len, &host, &keys, &n, NULL);
		assert_true(rc == -EINVAL || rc == -EBADMSG);
		if ((it & 1) && len >= HS && (len - HS) % KVFS_KEY_LEN == 0)
			assert_int_equal(rc, -EBADMSG);
		free(m);
	}
}

/* ---- the in-process bus ---- */

static void test_bus(void **state)
{
	static struct heard ha, hb, hc;
	struct kvfs_sight *a, *b, *c;
	uint8_t k[3][KVFS_KEY_LEN];

	heard_init(&ha);
	heard_init(&hb);
	heard_init(&hc);
	a = open_mem("t1", 0, &ha);
	b = open_mem("t1", 0, &hb);
	c = open_mem("t2", 0, &hc);
	assert_true(kvfs_sight_host(a) != kvfs_sight_host(b));
	for (uint32_t i = 0; i < 3; i++)
		key_of(100 + i, k[i]);

	kvfs_sight_note(a, k[0]);
	kvfs_sight_note(a, k[1]);
	assert_int_equal(stats_of(a).buffered, 2);
	assert_int_equal(kvfs_sight_flush(a), 0);
	assert_int_equal(stats_of(a).buffered, 0);
	assert_int_equal(hb.n, 2);
	assert_int_equal(hb.calls, 1);
	assert_memory_equal(hb.keys, k, 2 * KVFS_KEY_LEN);
	assert_int_equal(ha.n, 0); /* not its own */
	assert_int_equal(hc.n, 0); /* another channel */

	kvfs_sight_note(b, k[2]);
	assert_int_equal(kvfs_sight_flush(b), 0);
	assert_int_equal(ha.n, 1);
	assert_memory_equal(ha.keys[0], k[2], KVFS_KEY_LEN);
	assert_int_equal(hb.n, 2);
	assert_int_equal(hc.n, 0);

	/* Nothing buffered: nothing sent. */
	assert_int_equal(kvfs_sight_flush(a), 0);
	assert_int_equal(hb.calls, 1);

	struct kvfs_sight_stats sa = stats_of(a), sb = stats_of(b),
				sc = stats_of(c);
	assert_int_equal(sa.keys_out, 2);
	assert_int_equal(sa.msgs_out, 1);
	assert_int_equal(sa.keys_in, 1);
	assert_int_equal(sa.msgs_in, 1);
	assert_int_equal(sb.keys_out, 1);
	assert_int_equal(sb.keys_in, 2);
	assert_int_equal(sc.keys_in + sc.msgs_in + sc.rejected, 0);
	assert_int_equal(sa.dropped + sa.lost + sa.rejected + sa.errors, 0);

	kvfs_sight_free(a);
	kvfs_sight_free(b);
	kvfs_sight_free(c);
	heard_fini(&ha);
	heard_fini(&hb);
	heard_fini(&hc);
}

/* A batch over the per-message bound goes as several messages, in order. */
static void test_split(void **state)
{
	static struct heard ha, hb;
	const size_t total = 2 * KVFS_SIGHT_MSG_KEYS + 10;
	struct kvfs_sight *a, *b;
	uint8_t k[KVFS_KEY_LEN];

	heard_init(&ha);
	heard_init(&hb);
	a = open_mem("split", (unsigned)total, &ha);
	b = open_mem("split", 0, &hb);
	for (uint32_t i = 0; i < total; i++) {
		key_of(i, k);
		kvfs_sight_note(a, k);
	}
	assert_int_equal(kvfs_sight_flush(a), 0);
	assert_int_equal(stats_of(a).msgs_out, 3);
	assert_int_equal(stats_of(b).msgs_in, 3);
	assert_int_equal(hb.calls, 3);
	/* heard keeps the first 2 * KVFS_SIGHT_MSG_KEYS */
	assert_int_equal(stats_of(b).keys_in, total);
	for (uint32_t i = 0; i < hb.n; i++) {
		key_of(i, k);
		assert_memory_equal(hb.keys[i], k, KVFS_KEY_LEN);
	}
	kvfs_sight_free(a);
	kvfs_sight_free(b);
	heard_fini(&ha);
	heard_fini(&hb);
}

static void test_buffer_full(void **state)
{
	static struct heard ha, hb;
	struct kvfs_sight *a, *b;
	uint8_t k[KVFS_KEY_LEN];

	heard_init(&ha);
	heard_init(&hb);
	a = open_mem("full", 4, &ha);
	b = open_mem("full", 0, &hb);
	for (uint32_t i = 0; i < 6; i++) {
		key_of(i, k);
		kvfs_sight_note(a, k);
	}
	assert_int_equal(stats_of(a).dropped, 2);
	assert_int_equal(stats_of(a).buffered, 4);
	assert_int_equal(kvfs_sight_flush(a), 0);
	assert_int_equal(hb.n, 4);
	for (uint32_t i = 0; i < 4; i++) {
		key_of(i, k);
		assert_memory_equal(hb.keys[i], k, KVFS_KEY_LEN);
	}
	/* Room again once sent. */
	kvfs_sight_note(a, k);
	assert_int_equal(stats_of(a).dropped, 2);
	assert_int_equal(stats_of(a).buffered, 1);
	kvfs_sight_free(a);
	kvfs_sight_free(b);
	heard_fini(&ha);
	heard_fini(&hb);
}

/* Garbage on the channel is counted by every receiver and delivers
 * nothing; a valid message carrying a host's own id is skipped by that
 * host only.
 */
static void test_rejected(void **state)
{
	static struct heard ha, hb;
	uint8_t junk[100], msg[HS + KVFS_KEY_LEN], k[KVFS_KEY_LEN];
	struct kvfs_sight *a, *b;
	int len;

	heard_init(&ha);
	heard_init(&hb);
	a = open_mem("junk", 0, &ha);
	b = open_mem("junk", 0, &hb);
	memset(junk, 0xa5, sizeof(junk));
	assert_int_equal(kvfs_sight_inject(a, junk, sizeof(junk)), 0);
	assert_int_equal(kvfs_sight_inject(a, junk, 0), 0);
	assert_int_equal(stats_of(b).rejected, 2);
	assert_int_equal(stats_of(a).rejected, 2);
	assert_int_equal(hb.calls + ha.calls, 0);
	assert_int_equal(stats_of(b).msgs_in, 0);

	key_of(9, k);
	len = kvfs_sight_encode(kvfs_sight_host(b),
				(const uint8_t(*)[KVFS_KEY_LEN])k, 1, msg,
				sizeof(msg));
	assert_int_equal(len, (int)sizeof(msg));
	assert_int_equal(kvfs_sight_inject(a, msg, (size_t)len), 0);
	assert_int_equal(hb.n, 0);
	assert_int_equal(ha.n, 1);
	assert_memory_equal(ha.keys[0], k, KVFS_KEY_LEN);
	kvfs_sight_free(a);
	kvfs_sight_free(b);
	heard_fini(&ha);
	heard_fini(&hb);
}

/* Free publishes what is pending (and leaks nothing: make asan). */
static void test_free_pending(void **state)
{
	static struct heard ha, hb;
	struct kvfs_sight *a, *b;
	uint8_t k[KVFS_KEY_LEN];

	heard_init(&ha);
	heard_init(&hb);
	a = open_mem("pending", 0, &ha);
	b = open_mem("pending", 0, &hb);
	for (uint32_t i = 0; i < 3; i++) {
		key_of(i, k);
		kvfs_sight_note(a, k);
	}
	kvfs_sight_free(a);
	assert_int_equal(hb.n, 3);
	/* b alone on the channel now; its pending keys go nowhere. */
	kvfs_sight_note(b, k);
	kvfs_sight_free(b);
	assert_int_equal(ha.n, 0);
	heard_fini(&ha);
	heard_fini(&hb);
}

/* The sender publishes by itself every interval. */
static void test_sender(void **state)
{
	static struct heard ha, hb;
	struct kvfs_sight_conf c;
	struct kvfs_sight *a, *b;
	uint8_t k[KVFS_KEY_LEN];
	struct timespec dl;
	int rc = 0;

	heard_init(&ha);
	heard_init(&hb);
	kvfs_sight_conf_defaults(&c);
	c.backend = KVFS_SIGHT_MEMORY;
	strcpy(c.channel, "tick");
	c.interval_ms = 10;
	assert_int_equal(kvfs_sight_new(&c, on_keys, &ha, &a), 0);
	b = open_mem("tick", 0, &hb);
	key_of(77, k);
	kvfs_sight_note(a, k);
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += 30;
	pthread_mutex_lock(&hb.lock);
	while (!hb.n && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&hb.cond, &hb.lock, &dl);
	pthread_mutex_unlock(&hb.lock);
	assert_int_equal(hb.n, 1);
	assert_memory_equal(hb.keys[0], k, KVFS_KEY_LEN);
	kvfs_sight_free(a);
	kvfs_sight_free(b);
	heard_fini(&ha);
	heard_fini(&hb);
}

/* A loopback port with nothing listening. */
static int dead_port(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof(sa);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
	close(fd);
	return ntohs(sa.sin_port);
}

/* No server: the instance still starts and stops; a publish fails and
 * its batch is counted lost.
 */
static void test_redis_down(void **state)
{
	static struct heard h;
	struct kvfs_sight_conf c;
	struct kvfs_sight *s;
	uint8_t k[KVFS_KEY_LEN];

	heard_init(&h);
	kvfs_sight_conf_defaults(&c);
	c.backend = KVFS_SIGHT_REDIS;
	snprintf(c.nodes, sizeof(c.nodes), "127.0.0.1:%d", dead_port());
	c.interval_ms = 3600 * 1000;
	assert_int_equal(kvfs_sight_new(&c, on_keys, &h, &s), 0);
	key_of(1, k);
	kvfs_sight_note(s, k);
	kvfs_sight_note(s, k);
	assert_true(kvfs_sight_flush(s) < 0);
	assert_int_equal(stats_of(s).lost, 2);
	assert_int_equal(stats_of(s).keys_out, 0);
	assert_true(stats_of(s).errors >= 1);
	kvfs_sight_free(s);
	assert_int_equal(h.calls, 0);
	heard_fini(&h);
}

static void test_bad_conf(void **state)
{
	struct kvfs_sight_conf c;
	struct kvfs_sight *s = NULL;

	kvfs_sight_conf_defaults(&c);
	assert_int_equal(kvfs_sight_new(&c, on_keys, NULL, &s), -EINVAL);
	c.backend = KVFS_SIGHT_REDIS;
	assert_int_equal(kvfs_sight_new(&c, on_keys, NULL, &s), -EINVAL);
	strcpy(c.nodes, "localhost");
	assert_int_equal(kvfs_sight_new(&c, on_keys, NULL, &s), -EINVAL);
	strcpy(c.nodes, "h:1,,h:2");
	assert_int_equal(kvfs_sight_new(&c, on_keys, NULL, &s), -EINVAL);
	c.backend = KVFS_SIGHT_MEMORY;
	c.interval_ms = 0;
	assert_int_equal(kvfs_sight_new(&c, on_keys, NULL, &s), -EINVAL);
	c.interval_ms = 1000;
	c.buffer = 0;
	assert_int_equal(kvfs_sight_new(&c, on_keys, NULL, &s), -EINVAL);
	c.buffer = 1;
	c.channel[0] = 0;
	assert_int_equal(kvfs_sight_new(&c, on_keys, NULL, &s), -EINVAL);
	strcpy(c.channel, "x");
	assert_int_equal(kvfs_sight_new(&c, NULL, NULL, &s), -EINVAL);
	assert_null(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip),
		cmocka_unit_test(test_malformed),
		cmocka_unit_test(test_fuzz),
		cmocka_unit_test(test_bus),
		cmocka_unit_test(test_split),
		cmocka_unit_test(test_buffer_full),
		cmocka_unit_test(test_rejected),
		cmocka_unit_test(test_free_pending),
		cmocka_unit_test(test_sender),
		cmocka_unit_test(test_redis_down),
		cmocka_unit_test(test_bad_conf),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
