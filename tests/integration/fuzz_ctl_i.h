/* SPDX-License-Identifier: MIT */
/*
 * The .kvfs/ctl family of the mount fuzzer, shared by its three files:
 * fuzz_ctl_req.c draws requests and mutates them, fuzz_ctl_resp.c checks
 * what comes back, fuzz_ctl.c sends them over both transports and runs
 * the targets.  A request travels with what was decided while drawing it
 * (struct rq), because only that tells a refusal the contract demands
 * from a bug, and which bytes a success must have delivered.
 */
#ifndef KVFS_TESTS_INTEGRATION_FUZZ_CTL_I_H
#define KVFS_TESTS_INTEGRATION_FUZZ_CTL_I_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "meta/kvfs_ctl.h"
#include "fuzz_i.h"

#define RESP_HDR ((uint32_t)sizeof(struct kvfs_ctl_resp))
#define BLK_SIZE ((uint32_t)sizeof(struct kvfs_ctl_block))
#define REQ_HDR ((uint32_t)sizeof(struct kvfs_ctl_req))
/* The largest response an ioctl carries whole (kvfs_ctl_exec's E2BIG). */
#define IOC_MAX_BLOCKS ((KVFS_CTL_MSG_SIZE - RESP_HDR) / BLK_SIZE)

enum mem_kind {
	MEM_PEER,    /* our peer object, exactly as created */
	MEM_SYNCOBJ, /* our small object, as peer memory */
	MEM_BAD,     /* something peer_open must refuse, or garbage */
};

/* What was sent, for the checks. */
struct rq {
	uint8_t *b;        /* the bytes */
	size_t len;        /* bytes sent */
	uint16_t op;
	bool malformed;    /* a documented malformation was applied */
	char why[64];      /* which */
	bool ns_ok;        /* names the seeded namespace */
	uint32_t nk;       /* keys the daemon works on (chained or given) */
	int chain_seed;    /* >= 0: keys are that seed's chain, whole */
	enum mem_kind mem;
	bool sync_ours;    /* the sync word is in our sync object */
	bool sync_outside; /* ...named, but the word is not inside it */
	bool precise;      /* build: mostly what succeeds (real keys, our
			    * memory, ranges that fit), to reach deep
			    */
};

/* rq_keys() - the keys of @q's request (its token ids, with
 * KVFS_CTL_F_TOKENS), which follow the header.
 */
static inline const uint8_t (*rq_keys(const struct rq *q))[16]
{
	return (const void *)(q->b + REQ_HDR);
}

/*
 * build_req() - draw a well-formed request of @op into @q (q->b holds at
 *   least @cap bytes, and the request stays within them): every rule of
 *   check_req()'s contract in meta/kvfs_ctl.h holds, the fields come from
 *   the seeded keys, our shm objects and boundary values, and q->precise
 *   (the caller's) leans them towards what succeeds.  It never names a
 *   seeded block in a request that deletes.  Any thread.
 * malform() - mark @q malformed, @why (kept to 63 bytes) saying how.
 * mutate_bad() - break @q in a way check_req() or kvfs_ctl_exec() must
 *   refuse, within @cap bytes, and mark it malformed.  Any thread.
 * mutate_ok() - change bytes of @q the format leaves free, keeping it
 *   well-formed and seeded blocks safe from deletion; the checks it spoils
 *   are switched off in @q.
 * None fails.
 */
void build_req(struct rng *r, struct rq *q, uint16_t op, size_t cap);
void malform(struct rq *q, const char *why);
void mutate_bad(struct rng *r, struct rq *q, size_t cap);
void mutate_ok(struct rng *r, struct rq *q);

/*
 * check_resp() - the @got bytes at @buf are the response to @q, which
 * came by transport @tr (for messages): well-formed, with an error the
 * contract lists, blocks that fit the op, and, for a request that was
 * well-formed, the bytes the stored blocks hold where it delivered any
 * (blocks SAVE made are read back, then unlinked).  Counts the response in
 * tally.resp[] and tally.resp_ok[].  Fails the target by fz_fail().
 */
void check_resp(const struct rq *q, const uint8_t *buf, size_t got,
		const char *tr);

#endif
