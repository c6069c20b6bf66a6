// UD multicast across hosts (mcast_wire.sh): one program, two roles.
//
//   mcast_wire recv GIDX GROUP QKEY EXPECT READY STOP [DETACH_AFTER DETACHED]
//     A UD QP with Q_Key QKEY attached to GROUP; READY is created once it is.
//     Takes datagrams until the file STOP appears, each checked (payload
//     pattern, length, GRH naming the group). With DETACH_AFTER: once that
//     many arrived, detaches and creates DETACHED; any datagram after that
//     fails. Exits 0 when sequence numbers 0..EXPECT-1 each arrived exactly
//     once and nothing else did.
//   mcast_wire send GIDX GROUP QKEY FIRST COUNT SIZE HOP_LIMIT
//     COUNT datagrams of SIZE bytes (sequence numbers FIRST..) to GROUP with
//     remote QPN 0xFFFFFF from GID index GIDX, the AH's hop limit HOP_LIMIT.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

constexpr uint32_t kMcastQpn = 0xFFFFFF;
constexpr int kGrhBytes = 40;
constexpr size_t kMaxPayload = 1024;
constexpr size_t kSlot = kGrhBytes + kMaxPayload;
constexpr int kRecvs = 512;
constexpr auto kTimeout = std::chrono::seconds(90);
// A datagram: this magic, the sequence number, the length, a pattern. The
// magic first: tshark reads a UD payload that starts like an EtherType and
// two zero bytes (a small sequence number) as encapsulated Ethernet.
constexpr uint8_t kMagic[4] = {'x', 's', 'm', 'c'};
constexpr size_t kHeader = 12;

[[noreturn]] void die(const char *what)
{
	std::fprintf(stderr, "mcast_wire: %s: %s\n", what, std::strerror(errno));
	std::exit(2);
}

uint8_t pattern(uint32_t seq, size_t i)
{
	return static_cast<uint8_t>(seq * 31 + i);
}

bool file_exists(const char *path)
{
	return access(path, F_OK) == 0;
}

void touch(const char *path)
{
	FILE *f = std::fopen(path, "w");
	if (!f)
		die(path);
	std::fclose(f);
}

struct Device {
	ibv_context *ctx = nullptr;
	ibv_pd *pd = nullptr;
	ibv_cq *cq = nullptr;
	ibv_qp *qp = nullptr;
};

Device open_ud(uint32_t qkey)
{
	Device d;
	int n = 0;
	ibv_device **list = ibv_get_device_list(&n);
	for (int i = 0; list && i < n && !d.ctx; ++i)
		if (std::strcmp(ibv_get_device_name(list[i]), "xsrc0") == 0)
			d.ctx = ibv_open_device(list[i]);
	if (!d.ctx)
		die("no xsrc0");
	ibv_free_device_list(list);
	if (!(d.pd = ibv_alloc_pd(d.ctx)))
		die("ibv_alloc_pd");
	if (!(d.cq = ibv_create_cq(d.ctx, 2 * kRecvs, nullptr, nullptr, 0)))
		die("ibv_create_cq");
	ibv_qp_init_attr init{};
	init.send_cq = init.recv_cq = d.cq;
	init.qp_type = IBV_QPT_UD;
	init.cap = {kRecvs, kRecvs, 1, 1, 0};
	if (!(d.qp = ibv_create_qp(d.pd, &init)))
		die("ibv_create_qp");
	ibv_qp_attr a{};
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qkey = qkey;
	if (ibv_modify_qp(d.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		die("modify_qp INIT");
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(d.qp, &a, IBV_QP_STATE))
		die("modify_qp RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	if (ibv_modify_qp(d.qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		die("modify_qp RTS");
	return d;
}

ibv_gid parse_gid(const char *text)
{
	ibv_gid gid{};
	if (inet_pton(AF_INET6, text, gid.raw) != 1) {
		std::fprintf(stderr, "mcast_wire: not a GID: %s\n", text);
		std::exit(2);
	}
	return gid;
}

void post_recv(Device &d, ibv_mr *mr, uint8_t *buf, int slot)
{
	ibv_sge sge{reinterpret_cast<uint64_t>(buf + slot * kSlot), static_cast<uint32_t>(kSlot), mr->lkey};
	ibv_recv_wr wr{}, *bad;
	wr.wr_id = static_cast<uint64_t>(slot);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	if (ibv_post_recv(d.qp, &wr, &bad))
		die("ibv_post_recv");
}

// Why a datagram is wrong, or null.
const char *check_datagram(const ibv_wc &wc, const uint8_t *slot, const ibv_gid &group, uint32_t &seq)
{
	if (wc.status != IBV_WC_SUCCESS)
		return ibv_wc_status_str(wc.status);
	if (!(wc.wc_flags & IBV_WC_GRH))
		return "no GRH";
	if (wc.byte_len < kGrhBytes + kHeader)
		return "too short";
	const uint8_t *p = slot + kGrhBytes;
	uint32_t len;
	if (std::memcmp(p, kMagic, sizeof(kMagic)) != 0)
		return "no magic";
	std::memcpy(&seq, p + 4, 4);
	std::memcpy(&len, p + 8, 4);
	if (len != wc.byte_len - kGrhBytes)
		return "wrong length";
	for (size_t i = kHeader; i < len; ++i)
		if (p[i] != pattern(seq, i))
			return "payload differs";
	bool ipv4 = group.raw[10] == 0xFF && group.raw[11] == 0xFF && group.raw[0] == 0;
	// From the wire, as rxe: an IPv4 header in the GRH's last 20 bytes, else
	// the IPv6 header. Shared memory (this host's sender) writes a GRH of
	// IPv6 form with the GIDs for either.
	bool v4_header = ipv4 && slot[20] == 0x45 && std::memcmp(slot + 36, group.raw + 12, 4) == 0;
	bool v6_header = (slot[0] >> 4) == 6 && std::memcmp(slot + 24, group.raw, 16) == 0;
	if (!v4_header && !v6_header)
		return "the GRH does not name the group";
	return nullptr;
}

int receive(int argc, char **argv)
{
	if (argc != 8 && argc != 10)
		return 2;
	ibv_gid group = parse_gid(argv[3]);
	uint32_t qkey = static_cast<uint32_t>(std::strtoul(argv[4], nullptr, 0));
	uint32_t expect = static_cast<uint32_t>(std::strtoul(argv[5], nullptr, 0));
	const char *ready = argv[6], *stop = argv[7];
	uint32_t detach_after = argc == 10 ? static_cast<uint32_t>(std::strtoul(argv[8], nullptr, 0)) : 0;
	const char *detached = argc == 10 ? argv[9] : nullptr;

	Device d = open_ud(qkey);
	std::vector<uint8_t> buf(kRecvs * kSlot);
	ibv_mr *mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		die("ibv_reg_mr");
	for (int i = 0; i < kRecvs; ++i)
		post_recv(d, mr, buf.data(), i);
	if (ibv_attach_mcast(d.qp, &group, 0))
		die("ibv_attach_mcast");
	touch(ready);

	std::vector<uint32_t> seen(1 << 16);
	uint32_t total = 0, bad = 0, after_detach = 0;
	bool attached = true;
	auto deadline = std::chrono::steady_clock::now() + kTimeout;
	for (unsigned idle = 0;; ++idle) {
		ibv_wc wc[16];
		int n = ibv_poll_cq(d.cq, 16, wc);
		if (n < 0)
			die("ibv_poll_cq");
		for (int k = 0; k < n; ++k) {
			int slot = static_cast<int>(wc[k].wr_id);
			uint32_t seq = 0;
			const char *why = check_datagram(wc[k], buf.data() + slot * kSlot, group, seq);
			if (why) {
				std::fprintf(stderr, "mcast_wire: QP %u: bad datagram: %s\n", d.qp->qp_num, why);
				++bad;
			} else if (!attached) {
				std::fprintf(stderr, "mcast_wire: QP %u: datagram %u after detach\n", d.qp->qp_num, seq);
				++after_detach;
			} else {
				++seen[seq & 0xFFFF];
				++total;
			}
			post_recv(d, mr, buf.data(), slot);
		}
		if (attached && detach_after && total >= detach_after) {
			if (ibv_detach_mcast(d.qp, &group, 0))
				die("ibv_detach_mcast");
			attached = false;
			touch(detached);
		}
		if (n == 0) {
			if (idle % 256 == 0 && file_exists(stop))
				break;
			if (std::chrono::steady_clock::now() > deadline) {
				std::fprintf(stderr, "mcast_wire: timed out\n");
				break;
			}
			usleep(200);
		}
	}
	uint32_t missing = 0, duplicated = 0, unexpected = 0;
	for (uint32_t s = 0; s < seen.size(); ++s) {
		if (s < expect && seen[s] == 0)
			++missing;
		else if (s < expect && seen[s] > 1)
			duplicated += seen[s] - 1;
		else if (s >= expect)
			unexpected += seen[s];
	}
	std::printf("QP %u: %u datagrams: %u missing, %u duplicated, %u unexpected, %u bad, %u after detach\n",
		    d.qp->qp_num, total, missing, duplicated, unexpected, bad, after_detach);
	return missing || duplicated || unexpected || bad || after_detach ? 1 : 0;
}

int send(int argc, char **argv)
{
	if (argc != 9)
		return 2;
	int gid_index = std::atoi(argv[2]);
	ibv_gid group = parse_gid(argv[3]);
	uint32_t qkey = static_cast<uint32_t>(std::strtoul(argv[4], nullptr, 0));
	uint32_t first = static_cast<uint32_t>(std::strtoul(argv[5], nullptr, 0));
	uint32_t count = static_cast<uint32_t>(std::strtoul(argv[6], nullptr, 0));
	size_t size = std::strtoul(argv[7], nullptr, 0);
	int hop_limit = std::atoi(argv[8]);
	if (size < kHeader || size > kMaxPayload)
		return 2;

	Device d = open_ud(qkey);
	ibv_ah_attr ah_attr{};
	ah_attr.is_global = 1;
	ah_attr.grh.dgid = group;
	ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_index);
	ah_attr.grh.hop_limit = static_cast<uint8_t>(hop_limit);
	ah_attr.port_num = 1;
	ibv_ah *ah = ibv_create_ah(d.pd, &ah_attr);
	if (!ah)
		die("ibv_create_ah");
	std::vector<uint8_t> buf(size);
	ibv_mr *mr = ibv_reg_mr(d.pd, buf.data(), buf.size(), 0);
	if (!mr)
		die("ibv_reg_mr");
	for (uint32_t seq = first; seq < first + count; ++seq) {
		uint32_t len = static_cast<uint32_t>(size);
		std::memcpy(buf.data(), kMagic, sizeof(kMagic));
		std::memcpy(buf.data() + 4, &seq, 4);
		std::memcpy(buf.data() + 8, &len, 4);
		for (size_t i = kHeader; i < size; ++i)
			buf[i] = pattern(seq, i);
		ibv_sge sge{reinterpret_cast<uint64_t>(buf.data()), len, mr->lkey};
		ibv_send_wr wr{}, *bad;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.opcode = IBV_WR_SEND;
		wr.send_flags = IBV_SEND_SIGNALED;
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = kMcastQpn;
		wr.wr.ud.remote_qkey = qkey;
		if (ibv_post_send(d.qp, &wr, &bad))
			die("ibv_post_send");
		ibv_wc wc;
		int n;
		while ((n = ibv_poll_cq(d.cq, 1, &wc)) == 0) {
		}
		if (n < 0 || wc.status != IBV_WC_SUCCESS) {
			std::fprintf(stderr, "mcast_wire: send %u: %s\n", seq, n < 0 ? "poll failed" : ibv_wc_status_str(wc.status));
			return 1;
		}
		usleep(1000);  // a paced sender: the test is about delivery, not loss
	}
	std::printf("QP %u: sent %u datagrams of %zu bytes\n", d.qp->qp_num, count, size);
	return 0;
}

}  // namespace

int main(int argc, char **argv)
{
	std::string role = argc > 1 ? argv[1] : "";
	int rc = role == "recv" ? receive(argc, argv) : role == "send" ? send(argc, argv) : 2;
	if (rc == 2)
		std::fprintf(stderr,
			     "usage: mcast_wire recv GIDX GROUP QKEY EXPECT READY STOP [DETACH_AFTER DETACHED]\n"
			     "       mcast_wire send GIDX GROUP QKEY FIRST COUNT SIZE HOP_LIMIT\n");
	return rc;
}
