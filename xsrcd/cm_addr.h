// Addresses as the connection manager sees them: IPv4, IPv6 and AF_IB
// socket addresses, which device (and GID) an address belongs to, and the
// path records and address handles a resolved route is described by.
#pragma once

#include <netinet/in.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>
#include <sys/socket.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "cm.h"

namespace xsrc::cm {

inline constexpr sa_family_t kAfIb = 27;  // AF_IB, which glibc does not name

// struct sockaddr_ib of <rdma/rdma_cma.h> (librdmacm-dev), laid out as the ABI has it.
struct SockaddrIb {
	uint16_t sib_family;
	uint16_t sib_pkey;      // big endian
	uint32_t sib_flowinfo;  // big endian
	uint8_t sib_addr[16];
	uint64_t sib_sid;       // big endian
	uint64_t sib_sid_mask;  // big endian
	uint64_t sib_scope_id;
};
static_assert(sizeof(SockaddrIb) == 48);

// The size of the address `family` names; 0 for a family the CM does not serve.
size_t address_size(sa_family_t family);
// The size of an address the caller sent in a sockaddr_storage of `size`
// bytes, or 0 when the family is unknown or the size is wrong.
size_t checked_address_size(const sockaddr_storage &addr, size_t size);

bool is_any(const sockaddr_storage &addr);        // 0.0.0.0, ::, an AF_IB zero GID
bool is_loopback(const sockaddr_storage &addr);   // 127/8, ::1
uint16_t port_of(const sockaddr_storage &addr);   // host byte order; AF_IB: the service id's low 16 bits
void set_port(sockaddr_storage &addr, uint16_t port);
// Same address (not port): the kernel's cma_addr_cmp.
bool same_address(const sockaddr_storage &a, const sockaddr_storage &b);
// The wildcard address of `family`, port 0.
sockaddr_storage any_address(sa_family_t family);

// The GID an IP address has on a RoCE v2 port (::ffff:a.b.c.d for IPv4);
// AF_IB addresses carry their GID.
Gid gid_of(const sockaddr_storage &addr);

// Where a local address lives: its device and the port's GID for it.
struct Local {
	CmDevice device;
	unsigned gid_index = 0;
	Gid gid;
};
// The device an address of this host belongs to: an address of a device's
// netdev (or a GID of its port, for AF_IB), or loopback (127/8, ::1), which
// goes to the first device, as the kernel CM binds loopback.
std::optional<Local> find_local(const std::vector<CmDevice> &devices, const sockaddr_storage &addr);
// The first device, for a wildcard source resolved against loopback.
std::optional<Local> first_device(const std::vector<CmDevice> &devices, sa_family_t family);

// What a resolved route says: both GIDs, the MTU and the traffic class.
struct Route {
	Gid sgid, dgid;
	unsigned sgid_index = 0;
	int mtu = 3;       // enum ibv_mtu
	uint8_t tos = 0;
	uint8_t hop_limit = 64;
	uint8_t packet_life_time = 16;  // the kernel CM's RoCE default
};
// struct ib_user_path_rec (QUERY_ROUTE) and the SA wire form in
// struct ib_path_rec_data (QUERY with the path option).
ib_user_path_rec user_path_record(const Route &route);
ib_path_rec_data wire_path_record(const Route &route, uint64_t service_id);
// The address handle attributes toward `dgid` (UD events, INIT_QP_ATTR).
ib_uverbs_ah_attr ah_attr_of(const Route &route);

}  // namespace xsrc::cm
