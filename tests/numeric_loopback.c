/* Loopback addresses formatted numerically in getnameinfo: preloaded into the test session's processes (conftest.py).
 *
 * torch's TCPStore formats each new connection's addresses for its log lines with getnameinfo, which asks the name
 * server for the name of ::ffff:127.0.0.1 (not in /etc/hosts). Where the name server drops a query (one in 25 on the
 * development machines), that connection waits the resolver's timeout; with the suite's thousands of connections,
 * minutes. Only the text of an address of this machine changes ("127.0.0.1" for "localhost"): nothing is looked up
 * for it. Any other address is looked up as before. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

typedef int (*getnameinfo_t)(const struct sockaddr *, socklen_t, char *, socklen_t, char *, socklen_t, int);

static int loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

int getnameinfo(const struct sockaddr *sa, socklen_t salen, char *host, socklen_t hostlen, char *serv,
                socklen_t servlen, int flags) {
    static getnameinfo_t real;
    if (!real) real = (getnameinfo_t)dlsym(RTLD_NEXT, "getnameinfo");
    if (sa && loopback(sa)) flags |= NI_NUMERICHOST;
    return real(sa, salen, host, hostlen, serv, servlen, flags);
}
