// SPDX-License-Identifier: GPL-2.0
//
// ferry's network lock: a tcx program attached to ingress and egress of every
// interface of a network namespace. It drops every TCP packet whose 4-tuple is
// locked (see `table` below) and lets everything else through (TCX_NEXT, so any
// other tcx program after it still runs).
//
// One copy of the program and its maps serves every lock of the namespace
// (the namespace's "base"): it is loaded and attached once and stays. Each
// lock owns one of 64 owner slots; its tuples carry the slot number, and bit
// `slot` of `active[0]` says whether that lock is engaged. Engaging or
// disengaging a lock is one update of that word; nothing is attached or
// detached on a command's critical path. While no lock is engaged (the word
// is 0) a packet costs one array lookup.
//
// Wildcard entries: a key whose remote address and port are all zero stands
// for "new connections to local": at ingress, a TCP segment with SYN set and
// ACK clear whose exact key is not locked is looked up again with the
// remote side zeroed. Nothing else is ever matched against a wildcard.
//
// The key is always written from the point of view of the locked namespace:
// {local address, local port, remote address, remote port}. At ingress the
// local side is the packet's destination, at egress its source. On loopback a
// packet crosses egress and then ingress of `lo`: the direction whose
// destination is the frozen socket is caught at ingress, the other at egress.
//
// Compiled by build.rs with `clang -O2 -g -target bpf` and loaded by aya.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

// From include/uapi/linux/bpf.h of Linux 6.6+; Debian bookworm's headers are 6.1.
#define TCX_NEXT -1
#define TCX_DROP 2

#define FAMILY_V4 2  /* AF_INET */
#define FAMILY_V6 10 /* AF_INET6 */

// Must match `TupleKey` in src/ebpf.rs byte for byte (40 bytes, no padding).
// `owner` is the owning lock's slot in `table` and 0 in packets' keys and in
// the keys of `frozen`; `generation` tells the packets a lock kept apart from
// those of an earlier lock in the same slot (0 in packets' keys).
struct tuple_key {
	__u8 family;
	__u8 owner;
	__u16 generation;
	__u8 local_addr[16];
	__u8 remote_addr[16];
	__be16 local_port;
	__be16 remote_port;
};

// The tuples live in `table`, an open-addressing hash table that user space
// builds directly in the map's memory (BPF_F_MMAPABLE: a memcpy, no syscall,
// so engage costs the same for 10 and 10,000 tuples). A key sits in one of
// the TABLE_PROBES slots starting at table_hash(key with owner 0) &
// (TABLE_SLOTS - 1); all of them are searched (locks remove their entries,
// so an empty slot does not end a probe sequence). A key whose TABLE_PROBES
// slots were all taken goes to the `frozen` hash map instead (normally
// empty), whose value is the mask of owners that lock it.
// Must match TABLE_SLOTS, TABLE_PROBES and table_hash in src/ebpf.rs.
#define TABLE_SLOTS (1 << 16)
#define TABLE_PROBES 8

#ifndef BPF_F_MMAPABLE
#define BPF_F_MMAPABLE (1U << 10)
#endif

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TABLE_SLOTS);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct tuple_key);
} table SEC(".maps");

// Overflow of `table`. Elements are allocated on insert
// (BPF_F_NO_PREALLOC), so the large max_entries costs only the buckets.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 20);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct tuple_key);
	__type(value, __u64);
} frozen SEC(".maps");

// Every packet a lock drops is kept here first (network header on), so that
// it can be delivered once the lock is released instead of waiting for the
// sender's retransmission timer. When the ring is full the packet is only
// dropped (TCP retransmits it).
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20);
} held SEC(".maps");

// Per owner slot: packets its lock dropped without keeping them (the ring
// full, a packet too large or unreadable, or a match in `frozen`, which
// counts for every engaged lock). User space zeroes a slot's count when it
// engages the slot's lock; a lock whose count is still 0 after its thaw
// had every packet it dropped kept, so their delivery tells each peer all
// that it missed.
#define OWNER_SLOTS 64
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, OWNER_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

// A kept packet: this header, then `len` bytes from the network header.
// Must match `HeldHeader` in src/held.rs.
struct held_header {
	__u32 len;
	__u8 owner;
	__u8 ingress;
	__u16 generation;
};

#define HELD_SMALL 2048
#define HELD_LARGE 65536

struct held_small {
	struct held_header h;
	__u8 data[HELD_SMALL];
};

struct held_large {
	struct held_header h;
	__u8 data[HELD_LARGE];
};

// Bit n of active[0]: the lock in owner slot n is engaged.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} active SEC(".maps");

#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_ACK 0x10

// Fills `key` from the packet, swapping source and destination when the packet
// enters the namespace, and `*flags` with the TCP flags byte. Returns 0 when
// the packet is TCP over IPv4 or IPv6.
static __always_inline int packet_key(struct __sk_buff *skb, int ingress, struct tuple_key *key, __u8 *flags)
{
	__u8 *src, *dst;
	// Source port, destination port, sequence, acknowledgement, data
	// offset, flags: the first 14 bytes of the TCP header.
	__u8 tcp[14];
	__be16 ports[2];
	__u32 l4_offset;

	// Offsets are relative to the network header, so devices with and
	// without a link-layer header (ethernet, loopback, tun, wireguard) all work.
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		__u8 ip[20];
		if (bpf_skb_load_bytes_relative(skb, 0, ip, sizeof(ip), BPF_HDR_START_NET))
			return -1;
		if (ip[9] != IPPROTO_TCP)
			return -1;
		// A non-first fragment carries no TCP header.
		if (((ip[6] & 0x1f) | ip[7]) != 0)
			return -1;
		l4_offset = (ip[0] & 0x0f) * 4;
		key->family = FAMILY_V4;
		src = key->local_addr;
		dst = key->remote_addr;
		if (ingress) {
			src = key->remote_addr;
			dst = key->local_addr;
		}
		__builtin_memcpy(src, &ip[12], 4);
		__builtin_memcpy(dst, &ip[16], 4);
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		__u8 ip6[40];
		if (bpf_skb_load_bytes_relative(skb, 0, ip6, sizeof(ip6), BPF_HDR_START_NET))
			return -1;
		// Extension headers before TCP are not followed (TCP connections
		// do not carry them in practice).
		if (ip6[6] != IPPROTO_TCP)
			return -1;
		l4_offset = 40;
		key->family = FAMILY_V6;
		src = key->local_addr;
		dst = key->remote_addr;
		if (ingress) {
			src = key->remote_addr;
			dst = key->local_addr;
		}
		__builtin_memcpy(src, &ip6[8], 16);
		__builtin_memcpy(dst, &ip6[24], 16);
	} else {
		return -1;
	}
	if (bpf_skb_load_bytes_relative(skb, l4_offset, tcp, sizeof(tcp), BPF_HDR_START_NET))
		return -1;
	__builtin_memcpy(ports, tcp, sizeof(ports));
	*flags = tcp[13];
	key->local_port = ingress ? ports[1] : ports[0];
	key->remote_port = ingress ? ports[0] : ports[1];
	return 0;
}

// A 32-bit mix of the key's ten words (murmur3-style); see table_hash in
// src/ebpf.rs.
static __always_inline __u32 table_hash(const struct tuple_key *key)
{
	const __u32 *w = (const __u32 *)key;
	__u32 h = 0x9e3779b9;

#pragma unroll
	for (int i = 0; i < (int)(sizeof(*key) / 4); i++) {
		h ^= w[i];
		h *= 0x85ebca6b;
		h ^= h >> 13;
	}
	h ^= h >> 16;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

// The bytes of the key's first word that name the owner (bytes 1 to 3:
// owner and generation), in the host's byte order (BPF runs in it).
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define OWNER_MASK 0xffffff00ULL
#else
#define OWNER_MASK 0x00ffffff00000000ULL
#endif

// Same tuple, whoever owns the entry (`b` is a packet's key, owner 0).
static __always_inline int same_tuple(const struct tuple_key *entry, const struct tuple_key *b)
{
	const __u64 *x = (const __u64 *)entry, *y = (const __u64 *)b;

	return (x[0] & ~OWNER_MASK) == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3] &&
	       x[4] == y[4];
}

// The entry's owner and generation: LOCKED | generation << 8 | owner.
#define LOCKED (1U << 31)
#define UNKNOWN_OWNER 0xff

// Non-zero when an engaged lock (a bit of `engaged`) holds `key`: LOCKED
// with the owner and generation of the matching table entry (owner
// UNKNOWN_OWNER for the overflow map, whose packets are not kept).
static __always_inline __u32 locked(const struct tuple_key *key, __u64 engaged)
{
	__u32 home = table_hash(key);
	__u64 *owners;

	for (__u32 i = 0; i < TABLE_PROBES; i++) {
		__u32 slot = (home + i) & (TABLE_SLOTS - 1);
		struct tuple_key *entry = bpf_map_lookup_elem(&table, &slot);

		if (!entry || entry->family == 0)
			continue;
		if (same_tuple(entry, key) && ((engaged >> (entry->owner & 63)) & 1))
			return LOCKED | ((__u32)entry->generation << 8) | entry->owner;
	}
	owners = bpf_map_lookup_elem(&frozen, key);
	if (owners && (*owners & engaged))
		return LOCKED | UNKNOWN_OWNER;
	return 0;
}

// The IP packet's length from its header (0 when unknown, e.g. a GSO
// packet past 64 KiB).
static __always_inline __u32 ip_length(struct __sk_buff *skb)
{
	__u8 b[6];

	if (bpf_skb_load_bytes_relative(skb, 0, b, sizeof(b), BPF_HDR_START_NET))
		return 0;
	if (skb->protocol == bpf_htons(ETH_P_IP))
		return ((__u32)b[2] << 8) | b[3];
	return 40 + (((__u32)b[4] << 8) | b[5]);
}

// Reserves a record of type `kind` in `held`, fills it from the packet
// and submits it (discards it when the packet cannot be read). Returns 1
// when the packet was kept, 0 when not.
#define KEEP_AS(kind)                                                                   \
	do {                                                                            \
		struct kind *r = bpf_ringbuf_reserve(&held, sizeof(*r), 0);             \
		if (!r)                                                                 \
			return 0;                                                       \
		r->h.len = len;                                                         \
		r->h.owner = owner;                                                     \
		r->h.ingress = ingress;                                                 \
		r->h.generation = generation;                                           \
		if (bpf_skb_load_bytes_relative(skb, 0, r->data, len, BPF_HDR_START_NET)) { \
			bpf_ringbuf_discard(r, 0);                                      \
			return 0;                                                       \
		}                                                                       \
		bpf_ringbuf_submit(r, 0);                                               \
		return 1;                                                               \
	} while (0)

// Copies the dropped packet into `held` for the lock that dropped it;
// returns 1 when it was kept.
static __always_inline int keep(struct __sk_buff *skb, __u32 match, int ingress)
{
	__u32 len = ip_length(skb);
	__u8 owner = match & 0xff;
	__u16 generation = (match >> 8) & 0xffff;

	if (owner == UNKNOWN_OWNER || len == 0)
		return 0;
	// bpf_skb_load_bytes_relative reads only the linear part: make the
	// whole packet linear (it is dropped anyway).
	if (bpf_skb_pull_data(skb, skb->len))
		return 0;
	if (len <= HELD_SMALL)
		KEEP_AS(held_small);
	else if (len <= HELD_LARGE)
		KEEP_AS(held_large);
	return 0;
}

static __always_inline void count_lost_in(__u32 slot)
{
	__u64 *n = bpf_map_lookup_elem(&lost, &slot);

	if (n)
		__sync_fetch_and_add(n, 1);
}

// A packet dropped and not kept counts against its lock, or, when the
// owner is unknown (a match in `frozen`), against every engaged lock.
static __always_inline void count_lost(__u32 match, __u64 engaged)
{
	__u8 owner = match & 0xff;

	if (owner != UNKNOWN_OWNER) {
		count_lost_in(owner);
		return;
	}
	for (__u32 slot = 0; slot < OWNER_SLOTS; slot++)
		if (engaged & (1ULL << slot))
			count_lost_in(slot);
}

// Drops the packet of lock `match`, keeping it when it can.
static __always_inline int drop(struct __sk_buff *skb, __u32 match, __u64 engaged, int ingress)
{
	if (!keep(skb, match, ingress))
		count_lost(match, engaged);
	return TCX_DROP;
}

static __always_inline int verdict(struct __sk_buff *skb, int ingress)
{
	struct tuple_key key __attribute__((aligned(8))) = {};
	__u32 zero = 0;
	__u64 *engaged;
	__u64 mask;
	__u32 match;
	__u8 flags = 0;

	engaged = bpf_map_lookup_elem(&active, &zero);
	if (!engaged || !*engaged)
		return TCX_NEXT;
	mask = *engaged;
	if (packet_key(skb, ingress, &key, &flags))
		return TCX_NEXT;
	match = locked(&key, mask);
	if (match)
		return drop(skb, match, mask, ingress);
	// A connection attempt to a frozen listener: SYN without ACK, coming
	// in. Kept too: delivered to the restored listener, it saves the client
	// its SYN retransmission timeout (1 s).
	if (ingress && (flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN) {
		__builtin_memset(key.remote_addr, 0, sizeof(key.remote_addr));
		key.remote_port = 0;
		match = locked(&key, mask);
		if (match)
			return drop(skb, match, mask, ingress);
	}
	return TCX_NEXT;
}

// Two entry points instead of one that guesses the direction: at egress a
// forwarded packet still carries its input interface, so skb fields cannot
// tell the hooks apart reliably.
SEC("classifier")
int ferry_ingress(struct __sk_buff *skb)
{
	return verdict(skb, 1);
}

SEC("classifier")
int ferry_egress(struct __sk_buff *skb)
{
	return verdict(skb, 0);
}

char LICENSE[] SEC("license") = "GPL";
