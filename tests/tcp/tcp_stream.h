/*
 * What tcp_hold_server and tcp_hold_client share: the byte pattern of each
 * connection's stream and the parsing of ADDR PORT arguments.
 */
#ifndef FERRY_TCP_STREAM_H
#define FERRY_TCP_STREAM_H
#include "../conformance/ferry_test.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>

/* Byte i of stream `seed`: the client's stream of connection id is seed
 * 2*id, the server's 2*id+1. */
static unsigned char pat(uint64_t seed, size_t i)
{
	return (unsigned char)(ft_pat(seed, i / 8) >> (8 * (i % 8)));
}

/* Fills *ss from "ADDR" (IPv4 or IPv6) and "PORT"; returns the family. */
static int parse_addr(const char *addr, const char *port, struct sockaddr_storage *ss, socklen_t *sl)
{
	memset(ss, 0, sizeof(*ss));
	int fam = strchr(addr, ':') ? AF_INET6 : AF_INET;
	if (fam == AF_INET) {
		struct sockaddr_in *a = (struct sockaddr_in *)ss;
		a->sin_family = AF_INET;
		a->sin_port = htons((uint16_t)atoi(port));
		if (inet_pton(AF_INET, addr, &a->sin_addr) != 1)
			ft_die("bad address %s", addr);
		*sl = sizeof(*a);
	} else {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
		a->sin6_family = AF_INET6;
		a->sin6_port = htons((uint16_t)atoi(port));
		if (inet_pton(AF_INET6, addr, &a->sin6_addr) != 1)
			ft_die("bad address %s", addr);
		*sl = sizeof(*a);
	}
	return fam;
}

/* 10,000 connections need more than the default 1,024 descriptors; the
 * hard limit decides how far this gets. */
static void raise_fd_limit(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
}
#endif
