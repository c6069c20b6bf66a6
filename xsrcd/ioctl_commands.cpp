// The uverbs ioctl ABI (RDMA_VERBS_IOCTL), as far as xsrcd serves it: what
// libibverbs sends only through the ioctl, for an imported context
// (ibv_import_device, driver ABI r6): ASYNC_EVENT_ALLOC right after the
// provider's import_context, and CQ_CREATE and QP_CREATE, which it never
// sends through the write ABI for an imported context. Every other method
// answers ENOTTY, which tells libibverbs to use the write ABI (its probe at
// open needs exactly that); a context that was not imported never gets here.
//
// FUSE copies in and out only the 24-byte header the command number
// encodes; the attribute array that follows it is read from and written to
// the caller's memory, as the write commands' responses are. A create is
// the extended write command's handler run on the attributes: the same
// checks, the same objects, the same driver data (UHW_IN, UHW_OUT).
#include <rdma/ib_user_ioctl_cmds.h>
#include <rdma/rdma_user_ioctl_cmds.h>

#include <array>
#include <initializer_list>
#include <vector>

#include "dispatcher_handlers.h"
#include "xsrc-abi.h"

namespace xsrc {
namespace {

// As many attributes as any method of the kernel's takes; more is malformed.
constexpr uint16_t kMaxAttrs = 64;

// ASYNC_EVENT_ALLOC: the async pipe the provider named in IMPORT_CONTEXT
// becomes the imported context's async_fd (its number goes into the fd
// attribute's data, as the kernel writes a new fd's number there).
int async_event_alloc(Context &ctx, Caller &caller, std::span<const ib_uverbs_attr> attrs, uint64_t attrs_addr)
{
	if (attrs.size() != 1 || attrs[0].attr_id != UVERBS_ATTR_ASYNC_EVENT_ALLOC_FD_HANDLE || attrs[0].len ||
	    (attrs[0].flags & ~UVERBS_ATTR_F_MANDATORY) || attrs[0].attr_data.reserved)
		return refuse(EINVAL, "ASYNC_EVENT_ALLOC takes one fd attribute, FD_HANDLE");
	if (!ctx.import_async || ctx.import_async->pid != caller.pid())
		return refuse(EMFILE, "no async pipe named by an IMPORT_CONTEXT of this process");
	uint64_t fd = static_cast<uint32_t>(ctx.import_async->rd_fd);
	if (int err = caller.write_memory(attrs_addr + offsetof(ib_uverbs_attr, data), as_bytes_of(fd)))
		return err;
	ctx.import_async.reset();
	return 0;
}


// The attributes of one call, each id at most once. An id the method does
// not define is EPROTONOSUPPORT when mandatory and ignored when not, as in
// the kernel.
class Attrs {
public:
	int parse(std::span<const ib_uverbs_attr> attrs, uint64_t addr, std::initializer_list<uint16_t> known)
	{
		attrs_ = attrs;
		addr_ = addr;
		for (size_t i = 0; i < attrs.size(); ++i) {
			const ib_uverbs_attr &a = attrs[i];
			if (a.attr_data.reserved || (a.flags & ~UVERBS_ATTR_F_MANDATORY))
				return refuse(EINVAL, "an attribute's reserved bits or output flags set");
			for (size_t j = 0; j < i; ++j)
				if (attrs[j].attr_id == a.attr_id)
					return refuse(EINVAL, "an attribute given twice");
			bool defined = false;
			for (uint16_t id : known)
				defined |= id == a.attr_id;
			if (!defined && (a.flags & UVERBS_ATTR_F_MANDATORY))
				return refuse(EPROTONOSUPPORT, "a mandatory attribute the method does not define");
		}
		return 0;
	}

	const ib_uverbs_attr *find(uint16_t id) const
	{
		for (const ib_uverbs_attr &a : attrs_)
			if (a.attr_id == id)
				return &a;
		return nullptr;
	}
	// Where the caller holds attribute `a` (its data word is written for an
	// output object or fd, its flags for a written output pointer).
	uint64_t address_of(const ib_uverbs_attr &a) const { return addr_ + (&a - attrs_.data()) * sizeof(ib_uverbs_attr); }

	// An inline integer (4 or 8 bytes). Absent: `fallback`, or EINVAL when there is none.
	int value(uint16_t id, uint64_t &out, std::optional<uint64_t> fallback = {}) const
	{
		const ib_uverbs_attr *a = find(id);
		if (!a) {
			if (!fallback)
				return refuse(EINVAL, "a mandatory attribute is missing");
			out = *fallback;
			return 0;
		}
		if (a->len == 4)
			out = static_cast<uint32_t>(a->data);
		else if (a->len == 8)
			out = a->data;
		else
			return refuse(EINVAL, "an integer attribute of neither 4 nor 8 bytes");
		return 0;
	}
	// An object handle or an fd (no length, a 64-bit word).
	int handle(uint16_t id, std::optional<uint32_t> &out) const
	{
		out.reset();
		if (const ib_uverbs_attr *a = find(id)) {
			if (a->len || a->data > UINT32_MAX)
				return refuse(EINVAL, "a handle attribute with a length or past 32 bits");
			out = static_cast<uint32_t>(a->data);
		}
		return 0;
	}
	// An input buffer: inline up to 8 bytes, else at the pointer in data.
	int input(Caller &caller, uint16_t id, std::vector<std::byte> &out) const
	{
		out.clear();
		const ib_uverbs_attr *a = find(id);
		if (!a)
			return 0;
		out.resize(a->len);
		if (a->len <= sizeof(a->data)) {
			if (a->len)
				std::memcpy(out.data(), &a->data, a->len);
			return 0;
		}
		return caller.read_memory(a->data, out);
	}

private:
	std::span<const ib_uverbs_attr> attrs_;
	uint64_t addr_ = 0;
};

// Where a handler's response goes while it runs for an ioctl: an address no
// process has, kept here, then spread over the output attributes.
constexpr uint64_t kScratch = 0xffff800000000000ull;

class ScratchCaller final : public Caller {
public:
	ScratchCaller(Caller &inner, size_t size) : inner_(inner), bytes_(size) {}
	int write_memory(uint64_t addr, std::span<const std::byte> bytes) override
	{
		if (addr >= kScratch && bytes.size() <= bytes_.size() && addr - kScratch <= bytes_.size() - bytes.size()) {
			std::memcpy(bytes_.data() + (addr - kScratch), bytes.data(), bytes.size());
			return 0;
		}
		return inner_.write_memory(addr, bytes);
	}
	int read_memory(uint64_t addr, std::span<std::byte> bytes) override { return inner_.read_memory(addr, bytes); }
	int take_fd(int fd) override { return inner_.take_fd(fd); }
	int check_mapped(uint64_t addr, uint64_t length, bool writable) override
	{
		return inner_.check_mapped(addr, length, writable);
	}
	pid_t pid() const override { return inner_.pid(); }
	std::span<const std::byte> bytes() const { return bytes_; }

private:
	Caller &inner_;
	std::vector<std::byte> bytes_;
};

// The output attributes of a create: the new object's handle, output
// pointers, and the driver response (UHW_OUT).
class Outputs {
public:
	Outputs(Caller &caller, const Attrs &attrs) : caller_(caller), attrs_(attrs) {}

	// Room the caller gave UHW_OUT (0 without one).
	size_t driver_room() const
	{
		const ib_uverbs_attr *a = attrs_.find(UVERBS_ATTR_UHW_OUT);
		return a ? a->len : 0;
	}
	// Required outputs present, of the sizes the method writes.
	int check(uint16_t handle_id, std::initializer_list<std::pair<uint16_t, size_t>> pointers) const
	{
		const ib_uverbs_attr *h = attrs_.find(handle_id);
		if (!h || h->len)
			return refuse(EINVAL, "no output handle attribute");
		for (auto [id, size] : pointers) {
			const ib_uverbs_attr *a = attrs_.find(id);
			if (!a || a->len < size)
				return refuse(EINVAL, "an output attribute missing or too short");
		}
		return 0;
	}
	int handle(uint16_t id, uint32_t value)
	{
		uint64_t word = value;
		return caller_.write_memory(attrs_.address_of(*attrs_.find(id)) + offsetof(ib_uverbs_attr, data),
					    as_bytes_of(word));
	}
	// Output pointer `id` gets `bytes` (at most its length), and the
	// VALID_OUTPUT flag, as the kernel writes them.
	int pointer(uint16_t id, std::span<const std::byte> bytes)
	{
		const ib_uverbs_attr *a = attrs_.find(id);
		if (!a)
			return 0;
		if (int err = caller_.write_memory(a->data, bytes.first(std::min<size_t>(bytes.size(), a->len))))
			return err;
		uint16_t flags = a->flags | UVERBS_ATTR_F_VALID_OUTPUT;
		return caller_.write_memory(attrs_.address_of(*a) + offsetof(ib_uverbs_attr, flags), as_bytes_of(flags));
	}

private:
	Caller &caller_;
	const Attrs &attrs_;
};

// Runs an extended create handler on `core` and the UHW_IN bytes with its
// response kept in scratch: the core response, then the driver response.
template <typename CoreResp>
int run_create(Context &ctx, Caller &caller, Handler handler, std::span<const std::byte> core,
	       std::span<const std::byte> uhw_in, size_t uhw_out, std::vector<std::byte> &resp)
{
	Request req;
	req.core = core;
	req.driver = uhw_in;
	req.response = kScratch;
	req.core_resp_len = sizeof(CoreResp);
	req.resp_len = sizeof(CoreResp) + uhw_out;
	req.extended = true;
	ScratchCaller scratch(caller, req.resp_len);
	if (int err = handler(ctx, scratch, req))
		return err;
	resp.assign(scratch.bytes().begin(), scratch.bytes().end());
	return 0;
}

int cq_create(Context &ctx, Caller &caller, const Attrs &a)
{
	ib_uverbs_ex_create_cq cmd{};
	uint64_t user_handle, cqe, vector, flags;
	std::optional<uint32_t> channel;
	if (int err = a.value(UVERBS_ATTR_CREATE_CQ_USER_HANDLE, user_handle))
		return err;
	cmd.user_handle = user_handle;
	if (int err = a.value(UVERBS_ATTR_CREATE_CQ_CQE, cqe))
		return err;
	if (int err = a.value(UVERBS_ATTR_CREATE_CQ_COMP_VECTOR, vector))
		return err;
	if (int err = a.value(UVERBS_ATTR_CREATE_CQ_FLAGS, flags, 0))
		return err;
	if (int err = a.handle(UVERBS_ATTR_CREATE_CQ_COMP_CHANNEL, channel))
		return err;
	if (cqe > UINT32_MAX || vector > UINT32_MAX || flags > UINT32_MAX)
		return refuse(EINVAL, "a 32-bit attribute past 32 bits");
	cmd.cqe = static_cast<uint32_t>(cqe);
	cmd.comp_vector = static_cast<uint32_t>(vector);
	cmd.comp_channel = channel ? static_cast<int32_t>(*channel) : -1;
	cmd.flags = static_cast<uint32_t>(flags);
	// UVERBS_ATTR_CREATE_CQ_EVENT_FD: the CQ's events go to the context's async pipe.
	Outputs out(caller, a);
	if (int err = out.check(UVERBS_ATTR_CREATE_CQ_HANDLE, {{UVERBS_ATTR_CREATE_CQ_RESP_CQE, sizeof(uint32_t)}}))
		return err;
	std::vector<std::byte> uhw_in, resp;
	if (int err = a.input(caller, UVERBS_ATTR_UHW_IN, uhw_in))
		return err;
	if (int err = run_create<ib_uverbs_ex_create_cq_resp>(ctx, caller, cmd_ex_create_cq, as_bytes_of(cmd), uhw_in,
							       out.driver_room(), resp))
		return err;
	auto core = load<ib_uverbs_ex_create_cq_resp>(resp);
	int err = out.handle(UVERBS_ATTR_CREATE_CQ_HANDLE, core.base.cq_handle);
	if (!err)
		err = out.pointer(UVERBS_ATTR_CREATE_CQ_RESP_CQE, as_bytes_of(core.base.cqe));
	if (!err)
		err = out.pointer(UVERBS_ATTR_UHW_OUT, std::span(resp).subspan(sizeof(core)));
	if (err)
		release_cq(ctx, core.base.cq_handle);  // the caller never learnt of it
	return err;
}

int qp_create(Context &ctx, Caller &caller, const Attrs &a)
{
	ib_uverbs_ex_create_qp cmd{};
	uint64_t user_handle, type, flags;
	std::optional<uint32_t> pd, xrcd, send_cq, recv_cq, srq, ind_table;
	if (int err = a.value(UVERBS_ATTR_CREATE_QP_USER_HANDLE, user_handle))
		return err;
	cmd.user_handle = user_handle;
	if (int err = a.value(UVERBS_ATTR_CREATE_QP_TYPE, type))
		return err;
	if (int err = a.value(UVERBS_ATTR_CREATE_QP_FLAGS, flags, 0))
		return err;
	for (auto [id, out] : {std::pair{UVERBS_ATTR_CREATE_QP_PD_HANDLE, &pd}, std::pair{UVERBS_ATTR_CREATE_QP_XRCD_HANDLE, &xrcd},
			       std::pair{UVERBS_ATTR_CREATE_QP_SEND_CQ_HANDLE, &send_cq},
			       std::pair{UVERBS_ATTR_CREATE_QP_RECV_CQ_HANDLE, &recv_cq},
			       std::pair{UVERBS_ATTR_CREATE_QP_SRQ_HANDLE, &srq},
			       std::pair{UVERBS_ATTR_CREATE_QP_IND_TABLE_HANDLE, &ind_table}})
		if (int err = a.handle(id, *out))
			return err;
	if (a.find(UVERBS_ATTR_CREATE_QP_SOURCE_QPN))
		return refuse(EOPNOTSUPP, "a source QPN (IPoIB) on a RoCE device");
	if (type > UINT8_MAX || flags > UINT32_MAX)
		return refuse(EINVAL, "a QP type or flags past their width");
	// As the write ABI carries it: an XRC receive QP's domain in pd_handle.
	if (pd.has_value() == xrcd.has_value())
		return refuse(EINVAL, "a QP needs a PD or, for XRC receive, a domain");
	cmd.pd_handle = pd ? *pd : *xrcd;
	cmd.send_cq_handle = send_cq.value_or(0);
	cmd.recv_cq_handle = recv_cq.value_or(0);
	cmd.srq_handle = srq.value_or(0);
	cmd.is_srq = srq.has_value();
	if (ind_table) {
		cmd.comp_mask |= IB_UVERBS_CREATE_QP_MASK_IND_TABLE;
		cmd.rwq_ind_tbl_handle = *ind_table;
	}
	cmd.qp_type = static_cast<uint8_t>(type);
	cmd.sq_sig_all = (flags & IB_UVERBS_QP_CREATE_SQ_SIG_ALL) != 0;
	cmd.create_flags = static_cast<uint32_t>(flags & ~uint64_t{IB_UVERBS_QP_CREATE_SQ_SIG_ALL});
	std::vector<std::byte> cap_bytes;
	if (int err = a.input(caller, UVERBS_ATTR_CREATE_QP_CAP, cap_bytes))
		return err;
	if (cap_bytes.size() != sizeof(ib_uverbs_qp_cap))
		return refuse(EINVAL, "no QP capabilities of their size");
	auto cap = load<ib_uverbs_qp_cap>(cap_bytes);
	cmd.max_send_wr = cap.max_send_wr;
	cmd.max_recv_wr = cap.max_recv_wr;
	cmd.max_send_sge = cap.max_send_sge;
	cmd.max_recv_sge = cap.max_recv_sge;
	cmd.max_inline_data = cap.max_inline_data;
	// UVERBS_ATTR_CREATE_QP_EVENT_FD: the QP's events go to the context's async pipe.
	Outputs out(caller, a);
	if (int err = out.check(UVERBS_ATTR_CREATE_QP_HANDLE, {{UVERBS_ATTR_CREATE_QP_RESP_CAP, sizeof(ib_uverbs_qp_cap)},
								{UVERBS_ATTR_CREATE_QP_RESP_QP_NUM, sizeof(uint32_t)}}))
		return err;
	std::vector<std::byte> uhw_in, resp;
	if (int err = a.input(caller, UVERBS_ATTR_UHW_IN, uhw_in))
		return err;
	if (int err = run_create<ib_uverbs_ex_create_qp_resp>(ctx, caller, cmd_ex_create_qp, as_bytes_of(cmd), uhw_in,
							       out.driver_room(), resp))
		return err;
	auto core = load<ib_uverbs_ex_create_qp_resp>(resp);
	ib_uverbs_qp_cap got{core.base.max_send_wr, core.base.max_recv_wr, core.base.max_send_sge,
			     core.base.max_recv_sge, core.base.max_inline_data};
	int err = out.handle(UVERBS_ATTR_CREATE_QP_HANDLE, core.base.qp_handle);
	if (!err)
		err = out.pointer(UVERBS_ATTR_CREATE_QP_RESP_CAP, as_bytes_of(got));
	if (!err)
		err = out.pointer(UVERBS_ATTR_CREATE_QP_RESP_QP_NUM, as_bytes_of(core.base.qpn));
	if (!err)
		err = out.pointer(UVERBS_ATTR_UHW_OUT, std::span(resp).subspan(sizeof(core)));
	if (err)
		release_qp(ctx, core.base.qp_handle);  // the caller never learnt of it
	return err;
}

}  // namespace

int dispatch_ioctl(Context &ctx, Caller &caller, std::span<const std::byte> header, uint64_t arg)
{
	// A context never imported has no ioctl framework at all, as before
	// revision 6: libibverbs' probe at open gets ENOTTY and uses the write
	// ABI for everything.
	if (header.size() != sizeof(ib_uverbs_ioctl_hdr) || !ctx.imported || abi_revision(ctx) < 6)
		return refuse(ENOTTY, "no ioctl framework: not an imported context, or not an RDMA_VERBS_IOCTL");
	auto hdr = load<ib_uverbs_ioctl_hdr>(header);
	if (hdr.reserved1 || hdr.reserved2)
		return refuse(EINVAL, "non-zero reserved field in the ioctl header");
	if (hdr.num_attrs > kMaxAttrs ||
	    hdr.length != sizeof(ib_uverbs_ioctl_hdr) + size_t{hdr.num_attrs} * sizeof(ib_uverbs_attr))
		return refuse(EINVAL, "the ioctl header's length does not match its attribute count");
	enum class Method { none, async_event_alloc, cq_create, qp_create };
	Method method = Method::none;
	if (hdr.object_id == UVERBS_OBJECT_ASYNC_EVENT && hdr.method_id == UVERBS_METHOD_ASYNC_EVENT_ALLOC)
		method = Method::async_event_alloc;
	else if (hdr.object_id == UVERBS_OBJECT_CQ && hdr.method_id == UVERBS_METHOD_CQ_CREATE)
		method = Method::cq_create;
	else if (hdr.object_id == UVERBS_OBJECT_QP && hdr.method_id == UVERBS_METHOD_QP_CREATE)
		method = Method::qp_create;
	// Once a context was imported, a method not served is EPROTONOSUPPORT:
	// libibverbs then falls back to the write ABI for that method alone,
	// where ENOTTY would turn the ioctl off for all of them, creates
	// included, which it sends an imported context by ioctl only. (The
	// first context's libibverbs sends no ioctl any more.)
	if (method == Method::none)
		return refuse(EPROTONOSUPPORT, "an ioctl method not served: the write ABI serves it");
	std::array<ib_uverbs_attr, kMaxAttrs> attrs;
	std::span<ib_uverbs_attr> used(attrs.data(), hdr.num_attrs);
	const uint64_t attrs_addr = arg + sizeof(ib_uverbs_ioctl_hdr);
	if (int err = caller.read_memory(attrs_addr, std::as_writable_bytes(used)))
		return err;
	if (method == Method::async_event_alloc)
		return async_event_alloc(ctx, caller, used, attrs_addr);
	Attrs a;
	if (method == Method::cq_create) {
		if (int err = a.parse(used, attrs_addr,
				      {UVERBS_ATTR_CREATE_CQ_HANDLE, UVERBS_ATTR_CREATE_CQ_CQE, UVERBS_ATTR_CREATE_CQ_USER_HANDLE,
				       UVERBS_ATTR_CREATE_CQ_COMP_CHANNEL, UVERBS_ATTR_CREATE_CQ_COMP_VECTOR,
				       UVERBS_ATTR_CREATE_CQ_FLAGS, UVERBS_ATTR_CREATE_CQ_RESP_CQE, UVERBS_ATTR_CREATE_CQ_EVENT_FD,
				       UVERBS_ATTR_UHW_IN, UVERBS_ATTR_UHW_OUT}))
			return err;
		return cq_create(ctx, caller, a);
	}
	if (int err = a.parse(used, attrs_addr,
			      {UVERBS_ATTR_CREATE_QP_HANDLE, UVERBS_ATTR_CREATE_QP_XRCD_HANDLE, UVERBS_ATTR_CREATE_QP_PD_HANDLE,
			       UVERBS_ATTR_CREATE_QP_SRQ_HANDLE, UVERBS_ATTR_CREATE_QP_SEND_CQ_HANDLE,
			       UVERBS_ATTR_CREATE_QP_RECV_CQ_HANDLE, UVERBS_ATTR_CREATE_QP_IND_TABLE_HANDLE,
			       UVERBS_ATTR_CREATE_QP_USER_HANDLE, UVERBS_ATTR_CREATE_QP_CAP, UVERBS_ATTR_CREATE_QP_TYPE,
			       UVERBS_ATTR_CREATE_QP_FLAGS, UVERBS_ATTR_CREATE_QP_SOURCE_QPN, UVERBS_ATTR_CREATE_QP_EVENT_FD,
			       UVERBS_ATTR_CREATE_QP_RESP_CAP, UVERBS_ATTR_CREATE_QP_RESP_QP_NUM, UVERBS_ATTR_UHW_IN,
			       UVERBS_ATTR_UHW_OUT}))
		return err;
	return qp_create(ctx, caller, a);
}

}  // namespace xsrc
