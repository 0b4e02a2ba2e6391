// SPDX-License-Identifier: GPL-2.0
//
// ferry's network lock: a tcx program attached to ingress and egress of every
// interface of a network namespace. It drops every TCP packet whose 4-tuple is
// in the `frozen` hash map and lets everything else through (TCX_NEXT, so any
// other tcx program after it still runs).
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
struct tuple_key {
	__u8 family;
	__u8 pad[3];
	__u8 local_addr[16];
	__u8 remote_addr[16];
	__be16 local_port;
	__be16 remote_port;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1); // set to the number of tuples at load time
	__type(key, struct tuple_key);
	__type(value, __u8);
} frozen SEC(".maps");

// Fills `key` from the packet, swapping source and destination when the packet
// enters the namespace. Returns 0 when the packet is TCP over IPv4 or IPv6.
static __always_inline int packet_key(struct __sk_buff *skb, int ingress, struct tuple_key *key)
{
	__u8 *src, *dst;
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
	if (bpf_skb_load_bytes_relative(skb, l4_offset, ports, sizeof(ports), BPF_HDR_START_NET))
		return -1;
	key->local_port = ingress ? ports[1] : ports[0];
	key->remote_port = ingress ? ports[0] : ports[1];
	return 0;
}

static __always_inline int verdict(struct __sk_buff *skb, int ingress)
{
	struct tuple_key key = {};

	if (packet_key(skb, ingress, &key))
		return TCX_NEXT;
	if (bpf_map_lookup_elem(&frozen, &key))
		return TCX_DROP;
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
