/* SPDX-License-Identifier: MIT */
/*
 * The cluster client's pure parts: CRC16 and hash slots against the
 * examples of the Redis Cluster specification, hash tags, redirect and
 * address parsing, backoff; and a client whose seeds do not answer
 * (made anyway, its commands fail fast with a fault, never hang).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "meta/util.h"
#include "tier/redis_cluster.h"

static unsigned slot_of(const char *k)
{
	return kvfs_rc_slot(k, strlen(k));
}

static void test_crc16(void **state)
{
	/* The specification's reference output for "123456789". */
	assert_int_equal(kvfs_rc_crc16("123456789", 9), 0x31C3);
	assert_int_equal(kvfs_rc_crc16("", 0), 0);
}

static void test_slots(void **state)
{
	/* CLUSTER KEYSLOT answers of a Redis 7 server. */
	assert_int_equal(slot_of("foo"), 12182);
	assert_int_equal(slot_of("bar"), 5061);
	assert_int_equal(slot_of("hello"), 866);
	assert_int_equal(slot_of("123456789"), 0x31C3 % 16384);
}

static void test_hash_tags(void **state)
{
	/* The specification's examples of hash tags. */
	assert_int_equal(slot_of("{user1000}.following"),
			 slot_of("{user1000}.followers"));
	assert_int_equal(slot_of("{user1000}.following"), slot_of("user1000"));
	/* Only the first '{' counts, up to the first '}' after it. */
	assert_int_equal(slot_of("foo{bar}{zap}"), slot_of("bar"));
	assert_int_equal(slot_of("foo{{bar}}zap"), slot_of("{bar"));
	/* An empty tag hashes the whole key. */
	assert_int_equal(slot_of("foo{}{bar}"),
			 kvfs_rc_crc16("foo{}{bar}", 10) % 16384);
	/* No closing brace: the whole key. */
	assert_int_equal(slot_of("foo{bar"),
			 kvfs_rc_crc16("foo{bar", 7) % 16384);
	/* Keys of kvfs carry no tag: blocks spread over the slots. */
	assert_int_not_equal(slot_of("kvfs:feebf0027a7d68f558cfb7620bb8e449:"
				     "00000000000000000000000000000000"),
			     slot_of("kvfs:feebf0027a7d68f558cfb7620bb8e449:"
				     "00000000000000000000000000000001"));
}

static void test_redirects(void **state)
{
	char host[64];
	unsigned slot = 0;
	int ask = -1, port = 0;

	assert_int_equal(kvfs_rc_parse_redirect("MOVED 3999 127.0.0.1:6381",
						&ask, &slot, host, sizeof(host),
						&port),
			 0);
	assert_int_equal(ask, 0);
	assert_int_equal(slot, 3999);
	assert_string_equal(host, "127.0.0.1");
	assert_int_equal(port, 6381);
	assert_int_equal(kvfs_rc_parse_redirect("ASK 16383 redis-2:7002", &ask,
						&slot, host, sizeof(host),
						&port),
			 0);
	assert_int_equal(ask, 1);
	assert_int_equal(slot, 16383);
	assert_string_equal(host, "redis-2");
	assert_int_equal(port, 7002);
	/* An empty host: the node that answered. */
	assert_int_equal(kvfs_rc_parse_redirect("MOVED 1 :7000", &ask, &slot,
						host, sizeof(host), &port),
			 0);
	assert_string_equal(host, "");
	assert_int_equal(port, 7000);
	/* Everything else is not a redirect. */
	static const char *const bad[] = {
		"MOVED",
		"MOVED 3999",
		"MOVED 16384 h:1",
		"MOVED x h:1",
		"MOVED 1 h",
		"MOVED 1 h:0",
		"MOVED 1 h:65536",
		"MOVED 1 h:1x",
		"ASK  1 h:1",
		"TRYAGAIN Multiple keys",
		"CLUSTERDOWN down",
		"ERR wrong",
		"moved 1 h:1",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(kvfs_rc_parse_redirect(bad[i], &ask, &slot,
							host, sizeof(host),
							&port),
				 -EINVAL);
	/* A host longer than the buffer is refused, not cut. */
	assert_int_equal(kvfs_rc_parse_redirect("MOVED 1 abcdefgh:1", &ask,
						&slot, host, 8, &port),
			 -EINVAL);
}

static void test_addr(void **state)
{
	char host[64];
	int port;

	assert_int_equal(kvfs_rc_parse_addr("10.0.0.5:6379", 13, host,
					    sizeof(host), &port),
			 0);
	assert_string_equal(host, "10.0.0.5");
	assert_int_equal(port, 6379);
	assert_int_equal(
		kvfs_rc_parse_addr("h:1", 3, host, sizeof(host), &port), 0);
	assert_int_equal(kvfs_rc_parse_addr("nohost", 6, host, sizeof(host),
					    &port),
			 -EINVAL);
	assert_int_equal(kvfs_rc_parse_addr("h:", 2, host, sizeof(host), &port),
			 -EINVAL);
	assert_int_equal(kvfs_rc_parse_addr("h:99999", 7, host, sizeof(host),
					    &port),
			 -EINVAL);
}

struct addr_seen {
	char host[4][64];
	int port[4];
	int n;
	int stop_at; /* the callback refuses this item (-ENOSPC); -1: none */
};

static int addr_note(void *arg, const char *host, int port)
{
	struct addr_seen *a = arg;

	if (a->n == a->stop_at)
		return -ENOSPC;
	snprintf(a->host[a->n], sizeof(a->host[0]), "%s", host);
	a->port[a->n++] = port;
	return 0;
}

static void test_addr_list(void **state)
{
	struct addr_seen a = { .stop_at = -1 };
	const char *bad = NULL;
	size_t badlen = 0;

	/* Blanks around an item are not part of it. */
	assert_int_equal(kvfs_rc_parse_list(" a:1 ,\tb.example:6380\t",
					    addr_note, &a, &bad, &badlen),
			 0);
	assert_int_equal(a.n, 2);
	assert_string_equal(a.host[0], "a");
	assert_int_equal(a.port[0], 1);
	assert_string_equal(a.host[1], "b.example");
	assert_int_equal(a.port[1], 6380);

	/* The first bad item is named as written; the good ones before it
	 * were already handed over. */
	memset(&a, 0, sizeof(a));
	a.stop_at = -1;
	assert_int_equal(kvfs_rc_parse_list("a:1, b:0 ,c:3", addr_note, &a,
					    &bad, &badlen),
			 -EINVAL);
	assert_int_equal(a.n, 1);
	assert_int_equal((int)badlen, 5);
	assert_memory_equal(bad, " b:0 ", 5);

	/* Empty lists and empty items are malformed, not skipped. */
	assert_int_equal(kvfs_rc_parse_list("", addr_note, &a, NULL, NULL),
			 -EINVAL);
	assert_int_equal(kvfs_rc_parse_list("a:1,", addr_note, &a, NULL, NULL),
			 -EINVAL);
	assert_int_equal(kvfs_rc_parse_list("a:1,,b:2", addr_note, &a, NULL,
					    NULL),
			 -EINVAL);

	/* What the callback returns stops the walk and comes back. */
	memset(&a, 0, sizeof(a));
	a.stop_at = 1;
	assert_int_equal(kvfs_rc_parse_list("a:1,b:2,c:3", addr_note, &a, NULL,
					    NULL),
			 -ENOSPC);
	assert_int_equal(a.n, 1);
}

static void test_backoff(void **state)
{
	assert_int_equal(kvfs_rc_backoff_ms(0, 10, 200), 10);
	assert_int_equal(kvfs_rc_backoff_ms(1, 10, 200), 20);
	assert_int_equal(kvfs_rc_backoff_ms(2, 10, 200), 40);
	assert_int_equal(kvfs_rc_backoff_ms(4, 10, 200), 160);
	assert_int_equal(kvfs_rc_backoff_ms(5, 10, 200), 200);
	/* Never overflows, however many tries. */
	assert_int_equal(kvfs_rc_backoff_ms(1000, 10, 200), 200);
	assert_int_equal(kvfs_rc_backoff_ms(3, 0, 200), 0);
}

static void test_bad_seeds(void **state)
{
	struct kvfs_rc_conf c;
	struct kvfs_rc *rc;

	kvfs_rc_conf_defaults(&c);
	c.nodes = "";
	assert_int_equal(kvfs_rc_new(&c, &rc), -EINVAL);
	c.nodes = "127.0.0.1";
	assert_int_equal(kvfs_rc_new(&c, &rc), -EINVAL);
	c.nodes = "127.0.0.1:1,nope";
	assert_int_equal(kvfs_rc_new(&c, &rc), -EINVAL);
}

/* Seeds nobody listens on: the client is made, and a batch fails with a
 * fault after its retries, quickly, every command answered.
 */
static void test_no_server(void **state)
{
	struct kvfs_rc_conf c;
	struct kvfs_rc *rc;
	struct kvfs_rc_cmd cmd[3] = {
		{ .op = KVFS_RC_GET, .key = "a", .klen = 1 },
		{ .op = KVFS_RC_SETNX,
		  .key = "b",
		  .klen = 1,
		  .val = "x",
		  .vlen = 1 },
		{ .op = KVFS_RC_EXISTS, .key = "c", .klen = 1 },
	};
	uint64_t t0;

	kvfs_rc_conf_defaults(&c);
	/* Port 1 on loopback: refused at once. */
	c.nodes = " 127.0.0.1:1 , 127.0.0.1:2";
	c.timeout_ms = 100;
	assert_int_equal(kvfs_rc_new(&c, &rc), 0);
	assert_int_equal(kvfs_rc_nodes(rc), 0);
	t0 = kvfs_util_now_mono();
	assert_true(kvfs_rc_exec(rc, cmd, 3) < 0);
	for (int i = 0; i < 3; i++)
		assert_true(cmd[i].res < 0 && cmd[i].res != -ENOENT);
	assert_true(kvfs_util_now_mono() - t0 < 2000000000ull);
	assert_true(atomic_load(&kvfs_rc_stats(rc)->errors) > 0);
	kvfs_rc_free(rc);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_crc16),
		cmocka_unit_test(test_slots),
		cmocka_unit_test(test_hash_tags),
		cmocka_unit_test(test_redirects),
		cmocka_unit_test(test_addr),
		cmocka_unit_test(test_addr_list),
		cmocka_unit_test(test_backoff),
		cmocka_unit_test(test_bad_seeds),
		cmocka_unit_test(test_no_server),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
