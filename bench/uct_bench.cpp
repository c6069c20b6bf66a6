// uct_bench: latency and bandwidth of the xsrc UCT shim (uct/) between two processes on
// one device, measured through UCX's public API the way ucx_perftest measures its
// transports (bench/uct_bench.sh runs it beside ucx_perftest's rc_verbs and posix).
//
//   uct_bench [-d xsrc0] [-n iters] [-s size] [-c server_cpu,client_cpu] TEST
//   TEST: am_lat | put_lat | get_lat | put_bw | get_bw | am_bw
//
// Latency: median of the iterations in microseconds, one-way (half a round trip) for
// am_lat and put_lat, the whole operation for get_lat (as ucx_perftest reports them).
// Bandwidth: MiB/s (2^20 bytes), 16 operations in flight. Prints one line:
//   <test> <size> <value> <unit>
#include <xsrc/uct.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sched.h>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include "harness/child.h"
#include "harness/uct_iface.h"

namespace {

using Clock = std::chrono::steady_clock;

using xsrc::harness::Link;

[[noreturn]] void fail(const char *what, ucs_status_t st)
{
	fprintf(stderr, "uct_bench: %s: %s\n", what, ucs_status_string(st));
	exit(1);
}

struct Side : xsrc::harness::UctIface {
	uct_ep_h ep = nullptr;
	char *mem = nullptr;
	size_t len = 0;
	uct_mem_h memh = nullptr;
	uint64_t peer_addr = 0;
	uct_rkey_t rkey = 0;
	uint64_t am_seen = 0;  // written by the AM handler inside uct_iface_progress

	void open(const char *dev, size_t bytes)
	{
		ucs_status_t st;
		if ((st = open_worker()) != UCS_OK)
			fail("async/worker", st);
		if ((st = xsrc_uct_md_open(dev, nullptr, &md)) != UCS_OK)
			fail("md_open", st);
		if ((st = open_iface(std::string(dev) + ":1")) != UCS_OK)
			fail("iface_open", st);
		len = std::max<size_t>(bytes, 4096) * 2;
		mem = static_cast<char *>(aligned_alloc(4096, (len + 4095) / 4096 * 4096));
		memset(mem, 0, len);
		if ((st = xsrc_uct_md_mem_reg(md, mem, len, 0, &memh)) != UCS_OK)
			fail("mem_reg", st);
		uct_ep_params_t ep_params{};
		ep_params.field_mask = UCT_EP_PARAM_FIELD_IFACE;
		ep_params.iface = iface;
		if ((st = uct_ep_create(&ep_params, &ep)) != UCS_OK)
			fail("ep_create", st);
	}

	void connect(const Link &link)
	{
		std::string mine(attr.device_addr_len + attr.ep_addr_len + 16, '\0'), theirs;
		uct_iface_get_device_address(iface, reinterpret_cast<uct_device_addr_t *>(mine.data()));
		uct_ep_get_address(ep, reinterpret_cast<uct_ep_addr_t *>(mine.data() + attr.device_addr_len));
		uint64_t a = reinterpret_cast<uintptr_t>(mem);
		memcpy(mine.data() + attr.device_addr_len + attr.ep_addr_len, &a, 8);
		xsrc_uct_md_mkey_pack(md, memh, mine.data() + attr.device_addr_len + attr.ep_addr_len + 8);
		if (!link.send_frame(mine) || !link.recv_frame(&theirs, xsrc::harness::kForever) ||
		    theirs.size() != mine.size())
			fail("exchange", UCS_ERR_IO_ERROR);
		ucs_status_t st = uct_ep_connect_to_ep(ep, reinterpret_cast<uct_device_addr_t *>(theirs.data()),
						       reinterpret_cast<uct_ep_addr_t *>(theirs.data() + attr.device_addr_len));
		if (st != UCS_OK)
			fail("connect", st);
		memcpy(&peer_addr, theirs.data() + attr.device_addr_len + attr.ep_addr_len, 8);
		uct_rkey_bundle_t rb;
		if ((st = xsrc_uct_rkey_unpack(nullptr, theirs.data() + attr.device_addr_len + attr.ep_addr_len + 8, &rb)) !=
		    UCS_OK)
			fail("rkey_unpack", st);
		rkey = rb.rkey;
		char c = 0;  // both connected
		link.send_value(c);
		link.recv_value(&c, xsrc::harness::kForever);
	}

	void flush()
	{
		ucs_status_t st;
		while ((st = uct_ep_flush(ep, 0, nullptr)) == UCS_INPROGRESS || st == UCS_ERR_NO_RESOURCE)
			uct_iface_progress(iface);
		if (st != UCS_OK)
			fail("flush", st);
	}

	void close()
	{
		uct_ep_destroy(ep);
		xsrc_uct_md_mem_dereg(md, memh);
		UctIface::close();
		free(mem);
	}
};

ucs_status_t am_count(void *arg, void *, size_t, unsigned)
{
	++static_cast<Side *>(arg)->am_seen;
	return UCS_OK;
}

struct Done {
	uct_completion_t c;
	int done = 0;
};
void done_cb(uct_completion_t *c) { ++reinterpret_cast<Done *>(c)->done; }

double median(std::vector<double> &v)
{
	std::sort(v.begin(), v.end());
	return v.empty() ? 0 : v[v.size() / 2];
}

void pin(int cpu)
{
	if (cpu < 0)
		return;
	cpu_set_t s;
	CPU_ZERO(&s);
	CPU_SET(cpu, &s);
	sched_setaffinity(0, sizeof(s), &s);
}

// The ping-pong tests need both sides; the one-sided tests keep the server progressing only.
void run(Side &me, bool client, const std::string &test, size_t size, long iters, const Link &link)
{
	uct_iface_set_am_handler(me.iface, 1, am_count, &me, 0);
	std::vector<double> lat;
	lat.reserve(static_cast<size_t>(iters));
	std::vector<char> payload(size, 'p');
	if (test == "am_lat") {
		for (long k = 0; k < iters; ++k) {
			auto t0 = Clock::now();
			if (client) {
				while (uct_ep_am_short(me.ep, 1, 0, payload.data(), static_cast<unsigned>(size - std::min<size_t>(size, 8))) ==
				       UCS_ERR_NO_RESOURCE)
					uct_iface_progress(me.iface);
			}
			while (me.am_seen < static_cast<uint64_t>(k + 1))
				uct_iface_progress(me.iface);
			if (!client) {
				while (uct_ep_am_short(me.ep, 1, 0, payload.data(), static_cast<unsigned>(size - std::min<size_t>(size, 8))) ==
				       UCS_ERR_NO_RESOURCE)
					uct_iface_progress(me.iface);
			}
			lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 2);
		}
	} else if (test == "put_lat") {
		// Each side writes the iteration number into the other's first 8 bytes (last byte
		// of an `size`-byte put) and waits for its own.
		volatile uint64_t *mine = reinterpret_cast<volatile uint64_t *>(me.mem + size - 8);
		for (long k = 1; k <= iters; ++k) {
			auto t0 = Clock::now();
			uint64_t v = static_cast<uint64_t>(k);
			memcpy(payload.data() + size - 8, &v, 8);
			if (client)
				while (uct_ep_put_short(me.ep, payload.data(), static_cast<unsigned>(size), me.peer_addr, me.rkey) ==
				       UCS_ERR_NO_RESOURCE)
					uct_iface_progress(me.iface);
			while (*mine != v)
				uct_iface_progress(me.iface);
			if (!client)
				while (uct_ep_put_short(me.ep, payload.data(), static_cast<unsigned>(size), me.peer_addr, me.rkey) ==
				       UCS_ERR_NO_RESOURCE)
					uct_iface_progress(me.iface);
			lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / 2);
		}
	} else if (client && test == "get_lat") {
		uct_iov_t iov{me.mem, size, me.memh, 0, 1};
		for (long k = 0; k < iters; ++k) {
			Done d{{done_cb, 1, UCS_OK}};
			auto t0 = Clock::now();
			ucs_status_t st = uct_ep_get_zcopy(me.ep, &iov, 1, me.peer_addr, me.rkey, &d.c);
			if (st == UCS_INPROGRESS)
				while (!d.done)
					uct_iface_progress(me.iface);
			else if (st != UCS_OK)
				fail("get_zcopy", st);
			lat.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
		}
	} else if (client && (test == "put_bw" || test == "get_bw" || test == "am_bw")) {
		const int window = 16;
		uct_iov_t iov{me.mem, size, me.memh, 0, 1};
		std::vector<Done> slots(window);
		for (Done &d : slots)
			d = Done{{done_cb, 0, UCS_OK}, 1};
		auto t0 = Clock::now();
		for (long k = 0; k < iters;) {
			Done &d = slots[static_cast<size_t>(k % window)];
			if (!d.done) {
				uct_iface_progress(me.iface);
				continue;
			}
			d = Done{{done_cb, 1, UCS_OK}, 0};
			ucs_status_t st;
			if (test == "am_bw")
				st = uct_ep_am_zcopy(me.ep, 1, nullptr, 0, &iov, 1, 0, &d.c);
			else if (test == "put_bw")
				st = uct_ep_put_zcopy(me.ep, &iov, 1, me.peer_addr, me.rkey, &d.c);
			else
				st = uct_ep_get_zcopy(me.ep, &iov, 1, me.peer_addr, me.rkey, &d.c);
			if (st == UCS_ERR_NO_RESOURCE) {
				d.done = 1;
				uct_iface_progress(me.iface);
				continue;
			}
			if (st == UCS_OK)
				d.done = 1;
			else if (st != UCS_INPROGRESS)
				fail("op", st);
			++k;
		}
		for (Done &d : slots)
			while (!d.done)
				uct_iface_progress(me.iface);
		me.flush();
		double secs = std::chrono::duration<double>(Clock::now() - t0).count();
		printf("%s %zu %.1f MiB/s\n", test.c_str(), size, static_cast<double>(size) * iters / secs / (1 << 20));
	}
	if (client && !lat.empty())
		printf("%s %zu %.3f us\n", test.c_str(), size, median(lat));
	fflush(stdout);
	// Done: the client tells the server, which progressed meanwhile (it grants credits).
	char c = 1;
	if (client) {
		link.send_value(c);
	} else {
		do
			uct_iface_progress(me.iface);
		while (!link.readable());
		link.recv_value(&c, xsrc::harness::kForever);
	}
}

}  // namespace

int main(int argc, char **argv)
{
	const char *dev = "xsrc0";
	long iters = 10000;
	size_t size = 8;
	int cpus[2] = {-1, -1};
	int opt;
	while ((opt = getopt(argc, argv, "d:n:s:c:")) != -1) {
		switch (opt) {
		case 'd': dev = optarg; break;
		case 'n': iters = atol(optarg); break;
		case 's': size = strtoull(optarg, nullptr, 0); break;
		case 'c': sscanf(optarg, "%d,%d", &cpus[0], &cpus[1]); break;
		default: fprintf(stderr, "usage: uct_bench [-d dev] [-n iters] [-s size] [-c scpu,ccpu] TEST\n"); return 2;
		}
	}
	if (optind >= argc || iters <= 0 || size < 8) {
		fprintf(stderr, "usage: uct_bench [-d dev] [-n iters] [-s size>=8] [-c scpu,ccpu] TEST\n");
		return 2;
	}
	std::string test = argv[optind];
	if (test != "am_lat" && test != "put_lat" && test != "get_lat" && test != "put_bw" && test != "get_bw" &&
	    test != "am_bw") {
		fprintf(stderr, "uct_bench: unknown test %s\n", test.c_str());
		return 2;
	}
	// One side on the device, the server in a child process, the client here.
	auto side = [&](bool client, const Link &link) {
		pin(cpus[client ? 1 : 0]);
		Side me;
		me.open(dev, size);
		if ((test == "am_lat" || test == "am_bw") && size > me.attr.cap.am.max_zcopy) {
			fprintf(stderr, "uct_bench: %s: size above the AM limit %zu\n", test.c_str(), me.attr.cap.am.max_zcopy);
			return 2;
		}
		me.connect(link);
		run(me, client, test, size, iters, link);
		me.close();
		return 0;
	};
	auto server = xsrc::harness::Child::run([&](Link &link) { return side(false, link); });
	int rc = side(true, server.link());
	if (rc)
		return rc;
	auto status = server.wait(xsrc::harness::kForever);
	return status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0 ? 0 : 1;
}
