/*
 * fi_domain_filter: an LD_PRELOAD library that makes libfabric's fi_getinfo(3) return only
 * the fi_infos of one domain, named by $FI_DOMAIN_FILTER (exact match on
 * `domain_attr->name`); without the variable it changes nothing.
 *
 * Why: libfabric's verbs provider offers a device twice for `verbs;ofi_rxm`, as
 * `softverbs0` (RC) and `softverbs0-xrc` (XRC), and Open MPI 4.1's `mtl ofi` treats such
 * alike fi_infos as several NICs and spreads a host's ranks over them
 * (`opal_mca_common_ofi_select_provider`: a package rank, or the rank when that cannot be
 * computed, modulo the count); Open MPI 4.1 has no parameter that names a domain, and an RC
 * endpoint cannot connect to an XRC one. With this filter every rank sees one domain.
 * docs/guide/mpi.md, "Over XRC".
 *
 *     gcc -shared -fPIC -O1 -o fi_domain_filter.so fi_domain_filter.c -ldl
 *     mpirun ... -x LD_PRELOAD=$PWD/fi_domain_filter.so -x FI_DOMAIN_FILTER=softverbs0-xrc ...
 *
 * The two structs are the leading fields of libfabric's `struct fi_info` and
 * `struct fi_domain_attr` (rdma/fabric.h, unchanged since libfabric 1.0), declared here so
 * that building the filter needs no libfabric headers.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct fi_domain_attr_head {
    void *domain;
    char *name;
};

struct fi_info_head {
    struct fi_info_head *next;
    uint64_t caps;
    uint64_t mode;
    uint32_t addr_format;
    size_t src_addrlen;
    size_t dest_addrlen;
    void *src_addr;
    void *dest_addr;
    void *handle;
    void *tx_attr;
    void *rx_attr;
    void *ep_attr;
    struct fi_domain_attr_head *domain_attr;
    void *fabric_attr;
    void *nic;
};

typedef int (*getinfo_fn)(uint32_t, const char *, const char *, uint64_t, const void *,
                          struct fi_info_head **);
typedef void (*freeinfo_fn)(struct fi_info_head *);

int fi_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags,
               const void *hints, struct fi_info_head **info)
{
    getinfo_fn real = (getinfo_fn)dlsym(RTLD_NEXT, "fi_getinfo");
    if (!real)
        return -38; /* -FI_ENOSYS */
    int ret = real(version, node, service, flags, hints, info);
    const char *want = getenv("FI_DOMAIN_FILTER");
    if (ret || !want || !*want || !info)
        return ret;
    /* libfabric's own calls (ofi_rxm asking the verbs provider for its MSG endpoints, the
     * fabric and domain opens) see everything: only the application's answer is filtered. */
    Dl_info caller, lib;
    if (dladdr(__builtin_return_address(0), &caller) && dladdr((void *)real, &lib) &&
        caller.dli_fbase == lib.dli_fbase)
        return ret;
    freeinfo_fn freeinfo = (freeinfo_fn)dlsym(RTLD_NEXT, "fi_freeinfo");
    struct fi_info_head **link = info;
    while (*link) {
        struct fi_info_head *cur = *link;
        const char *name = cur->domain_attr ? cur->domain_attr->name : NULL;
        if (name && !strcmp(name, want)) {
            link = &cur->next;
            continue;
        }
        *link = cur->next;
        cur->next = NULL;
        if (freeinfo)
            freeinfo(cur);
    }
    return *info ? 0 : -61; /* -FI_ENODATA, as for no match */
}
