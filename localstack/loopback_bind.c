/*
 * loopback_bind.c - LD_PRELOAD shim that keeps wildcard listeners on loopback.
 *
 * LocalStack's gateway honours GATEWAY_LISTEN, but the helpers it spawns
 * (kinesis-mock on node, DynamoDB Local on java) bind the wildcard address.
 * This shim rewrites such binds before they reach libc:
 *   AF_INET  0.0.0.0 -> 127.0.0.1
 *   AF_INET6 ::      -> ::ffff:127.0.0.1 on a dual-stack socket (so clients of
 *                       127.0.0.1 still connect), ::1 on an IPV6_V6ONLY socket.
 * Non-wildcard binds and other address families pass through untouched.
 *
 * Build: gcc -shared -fPIC -O2 -o loopback_bind.so loopback_bind.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len)
{
    static bind_fn real_bind;
    if (!real_bind)
        real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");

    if (addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in in4;
        memcpy(&in4, addr, sizeof in4);
        if (in4.sin_addr.s_addr == htonl(INADDR_ANY)) {
            in4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            return real_bind(fd, (const struct sockaddr *)&in4, sizeof in4);
        }
    } else if (addr && addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 in6;
        memcpy(&in6, addr, sizeof in6);
        if (IN6_IS_ADDR_UNSPECIFIED(&in6.sin6_addr)) {
            int v6only = 0;
            socklen_t optlen = sizeof v6only;
            if (getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &optlen) != 0)
                v6only = 0;
            if (v6only) {
                in6.sin6_addr = in6addr_loopback;
            } else {
                memset(&in6.sin6_addr, 0, sizeof in6.sin6_addr);
                in6.sin6_addr.s6_addr[10] = 0xff;
                in6.sin6_addr.s6_addr[11] = 0xff;
                in6.sin6_addr.s6_addr[12] = 127;
                in6.sin6_addr.s6_addr[15] = 1;
            }
            return real_bind(fd, (const struct sockaddr *)&in6, sizeof in6);
        }
    }
    return real_bind(fd, addr, len);
}
