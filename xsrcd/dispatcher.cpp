// The command dispatcher: the command tables (one handler per command number,
// in the <object>_commands.cpp files), the decoding of one write() into a
// Request, the debug line for a refused command, and context teardown.
#include "dispatcher.h"

#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "dispatcher_handlers.h"
#include "xsrc-abi.h"

namespace xsrc {
namespace {

struct CommandSpec {
	const char *name = nullptr;  // for the debug log
	Handler handler = nullptr;
	size_t core_size = 0;      // size of the command's kernel struct
	size_t min_core_size = 0;  // what an older caller may send (a command that grew)
	bool has_response = false; // core struct starts with the response pointer
};

template <typename T>
constexpr CommandSpec spec(const char *name, Handler h, bool has_response,
			 size_t min_core_size = sizeof(T))
{
	return {name, h, sizeof(T), min_core_size, has_response};
}

// Indexed by command number (IB_USER_VERBS_CMD_COMMAND_MASK); a null handler
// is an unknown command.
constexpr size_t kCommandNumbers = IB_USER_VERBS_CMD_COMMAND_MASK + 1;
using CommandTable = std::array<CommandSpec, kCommandNumbers>;

const CommandTable &write_commands()
{
	static const auto table = [] {
		CommandTable t{};
		t[IB_USER_VERBS_CMD_GET_CONTEXT] =
			spec<ib_uverbs_get_context>("GET_CONTEXT", cmd_get_context, true);
		t[IB_USER_VERBS_CMD_QUERY_DEVICE] =
			spec<ib_uverbs_query_device>("QUERY_DEVICE", cmd_query_device, true);
		t[IB_USER_VERBS_CMD_QUERY_PORT] =
			spec<ib_uverbs_query_port>("QUERY_PORT", cmd_query_port, true);
		t[IB_USER_VERBS_CMD_ALLOC_PD] =
			spec<ib_uverbs_alloc_pd>("ALLOC_PD", cmd_alloc_pd, true);
		t[IB_USER_VERBS_CMD_DEALLOC_PD] =
			spec<ib_uverbs_dealloc_pd>("DEALLOC_PD", cmd_dealloc_pd, false);
		t[IB_USER_VERBS_CMD_CREATE_AH] =
			spec<ib_uverbs_create_ah>("CREATE_AH", cmd_create_ah, true);
		t[IB_USER_VERBS_CMD_DESTROY_AH] =
			spec<ib_uverbs_destroy_ah>("DESTROY_AH", cmd_destroy_ah, false);
		t[IB_USER_VERBS_CMD_REG_MR] = spec<ib_uverbs_reg_mr>("REG_MR", cmd_reg_mr, true);
		t[IB_USER_VERBS_CMD_DEREG_MR] =
			spec<ib_uverbs_dereg_mr>("DEREG_MR", cmd_dereg_mr, false);
		t[IB_USER_VERBS_CMD_REREG_MR] = spec<ib_uverbs_rereg_mr>("REREG_MR", cmd_rereg_mr, true);
		t[IB_USER_VERBS_CMD_ALLOC_MW] = spec<ib_uverbs_alloc_mw>("ALLOC_MW", cmd_alloc_mw, true);
		t[IB_USER_VERBS_CMD_DEALLOC_MW] =
			spec<ib_uverbs_dealloc_mw>("DEALLOC_MW", cmd_dealloc_mw, false);
		t[IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL] =
			spec<ib_uverbs_create_comp_channel>("CREATE_COMP_CHANNEL", cmd_create_comp_channel, true);
		t[IB_USER_VERBS_CMD_CREATE_CQ] =
			spec<ib_uverbs_create_cq>("CREATE_CQ", cmd_create_cq, true);
		t[IB_USER_VERBS_CMD_RESIZE_CQ] =
			spec<ib_uverbs_resize_cq>("RESIZE_CQ", cmd_resize_cq, true);
		t[IB_USER_VERBS_CMD_DESTROY_CQ] =
			spec<ib_uverbs_destroy_cq>("DESTROY_CQ", cmd_destroy_cq, true);
		t[IB_USER_VERBS_CMD_REQ_NOTIFY_CQ] =
			spec<ib_uverbs_req_notify_cq>("REQ_NOTIFY_CQ", cmd_req_notify_cq, false);
		t[IB_USER_VERBS_CMD_CREATE_QP] =
			spec<ib_uverbs_create_qp>("CREATE_QP", cmd_create_qp, true);
		t[IB_USER_VERBS_CMD_QUERY_QP] =
			spec<ib_uverbs_query_qp>("QUERY_QP", cmd_query_qp, true);
		t[IB_USER_VERBS_CMD_MODIFY_QP] =
			spec<ib_uverbs_modify_qp>("MODIFY_QP", cmd_modify_qp, false);
		t[IB_USER_VERBS_CMD_DESTROY_QP] =
			spec<ib_uverbs_destroy_qp>("DESTROY_QP", cmd_destroy_qp, true);
		t[IB_USER_VERBS_CMD_ATTACH_MCAST] =
			spec<ib_uverbs_attach_mcast>("ATTACH_MCAST", cmd_attach_mcast, false);
		t[IB_USER_VERBS_CMD_DETACH_MCAST] =
			spec<ib_uverbs_detach_mcast>("DETACH_MCAST", cmd_detach_mcast, false);
		t[IB_USER_VERBS_CMD_CREATE_SRQ] =
			spec<ib_uverbs_create_srq>("CREATE_SRQ", cmd_create_srq, true);
		t[IB_USER_VERBS_CMD_MODIFY_SRQ] =
			spec<ib_uverbs_modify_srq>("MODIFY_SRQ", cmd_modify_srq, false);
		t[IB_USER_VERBS_CMD_QUERY_SRQ] =
			spec<ib_uverbs_query_srq>("QUERY_SRQ", cmd_query_srq, true);
		t[IB_USER_VERBS_CMD_DESTROY_SRQ] =
			spec<ib_uverbs_destroy_srq>("DESTROY_SRQ", cmd_destroy_srq, true);
		t[IB_USER_VERBS_CMD_OPEN_XRCD] =
			spec<ib_uverbs_open_xrcd>("OPEN_XRCD", cmd_open_xrcd, true);
		t[IB_USER_VERBS_CMD_CLOSE_XRCD] =
			spec<ib_uverbs_close_xrcd>("CLOSE_XRCD", cmd_close_xrcd, false);
		t[IB_USER_VERBS_CMD_CREATE_XSRQ] =
			spec<ib_uverbs_create_xsrq>("CREATE_XSRQ", cmd_create_xsrq, true);
		t[IB_USER_VERBS_CMD_OPEN_QP] =
			spec<ib_uverbs_open_qp>("OPEN_QP", cmd_open_qp, true);
		t[XSRC_CMD_CHANNEL_POOL] =
			spec<xsrc_channel_pool>("XSRC_CHANNEL_POOL", cmd_channel_pool, true);
		t[XSRC_CMD_RAISE_EVENT] =
			spec<xsrc_raise_event>("XSRC_RAISE_EVENT", cmd_raise_event, false);
		t[XSRC_CMD_COPY] = spec<xsrc_copy>("XSRC_COPY", cmd_copy, true);
		t[XSRC_CMD_BIND_MW] = spec<xsrc_bind_mw>("XSRC_BIND_MW", cmd_bind_mw, false);
		t[XSRC_CMD_INVALIDATE] =
			spec<xsrc_invalidate>("XSRC_INVALIDATE", cmd_invalidate, false);
		t[XSRC_CMD_IMPORT_CONTEXT] =
			spec<xsrc_import_context>("XSRC_IMPORT_CONTEXT", cmd_import_context, true);
		t[XSRC_CMD_QUERY_OBJECT] =
			spec<xsrc_query_object>("XSRC_QUERY_OBJECT", cmd_query_object, true);
		t[XSRC_CMD_WIRE_RESPONSES] =
			spec<xsrc_wire_responses>("XSRC_WIRE_RESPONSES", cmd_wire_responses, false,
						   offsetof(xsrc_wire_responses, board_fd));
		t[XSRC_CMD_RECV_SHADOW] =
			spec<xsrc_recv_shadow>("XSRC_RECV_SHADOW", cmd_recv_shadow, false);
		return t;
	}();
	return table;
}

const CommandTable &ex_commands()
{
	static const auto table = [] {
		CommandTable t{};
		t[IB_USER_VERBS_EX_CMD_QUERY_DEVICE] =
			spec<ib_uverbs_ex_query_device>("EX_QUERY_DEVICE", cmd_ex_query_device, true);
		t[IB_USER_VERBS_EX_CMD_CREATE_CQ] =
			spec<ib_uverbs_ex_create_cq>("EX_CREATE_CQ", cmd_ex_create_cq, true);
		// As the kernel: the fields after comp_mask (create) and after the
		// base struct (modify) came later and may be missing.
		t[IB_USER_VERBS_EX_CMD_CREATE_QP] = spec<ib_uverbs_ex_create_qp>(
			"EX_CREATE_QP", cmd_ex_create_qp, true, offsetof(ib_uverbs_ex_create_qp, create_flags));
		t[IB_USER_VERBS_EX_CMD_MODIFY_QP] = spec<ib_uverbs_ex_modify_qp>(
			"EX_MODIFY_QP", cmd_ex_modify_qp, true, sizeof(ib_uverbs_modify_qp));
		return t;
	}();
	return table;
}

// The driver ABI revision that added a command (kernel-abi/README.md): a
// private one, or a core one the daemon did not serve before. A device
// serving an older revision answers EOPNOTSUPP, as that daemon did.
uint32_t command_revision(uint32_t num)
{
	switch (num) {
	case XSRC_CMD_COPY:
		return 2;
	case IB_USER_VERBS_CMD_ATTACH_MCAST:
	case IB_USER_VERBS_CMD_DETACH_MCAST:
		return 3;
	case IB_USER_VERBS_CMD_ALLOC_MW:
	case IB_USER_VERBS_CMD_DEALLOC_MW:
	case XSRC_CMD_BIND_MW:
	case XSRC_CMD_INVALIDATE:
		return 4;
	case XSRC_CMD_IMPORT_CONTEXT:
	case XSRC_CMD_QUERY_OBJECT:
		return 6;
	case XSRC_CMD_WIRE_RESPONSES:
		return 8;
	case XSRC_CMD_RECV_SHADOW:
		return 9;
	default:
		return 1;
	}
}

// The command a write() names, for the debug log.
std::string command_name(std::span<const std::byte> bytes)
{
	if (bytes.size() < sizeof(ib_uverbs_cmd_hdr))
		return "(no header)";
	auto hdr = load<ib_uverbs_cmd_hdr>(bytes);
	bool extended = hdr.command & IB_USER_VERBS_CMD_FLAG_EXTENDED;
	uint32_t num = hdr.command & IB_USER_VERBS_CMD_COMMAND_MASK;
	const CommandSpec &spec = (extended ? ex_commands() : write_commands())[num];
	if (spec.name)
		return spec.name;
	return std::string(extended ? "extended command " : "command ") + std::to_string(num);
}

void log_refusal(const Context &ctx, std::span<const std::byte> bytes, int err)
{
	const char *errname = strerrorname_np(err);
	debug_log("xsrcd: context %llu (pid %d): %s refused: %s (%d): %s",
		  static_cast<unsigned long long>(ctx.id), static_cast<int>(ctx.owner),
		  command_name(bytes).c_str(), errname ? errname : "?", err,
		  detail::refusal_reason ? detail::refusal_reason : "no reason given");
}

int decode_and_run(Context &ctx, Caller &caller, std::span<const std::byte> bytes);

// Collects first, since releasing erases from the map being walked.
template <typename T>
void release_all(Context &ctx, void (*release)(Context &, uint32_t))
{
	std::vector<uint32_t> handles;
	for (const auto &[handle, obj] : ctx.objects)
		if (std::holds_alternative<T>(obj))
			handles.push_back(handle);
	for (uint32_t handle : handles)
		release(ctx, handle);
}

}  // namespace

int dispatch_command(Context &ctx, Caller &caller, std::span<const std::byte> bytes)
{
	if (!debug_enabled())
		return decode_and_run(ctx, caller, bytes);
	detail::refusal_reason = nullptr;
	int err = decode_and_run(ctx, caller, bytes);
	if (err)
		log_refusal(ctx, bytes, err);
	return err;
}

namespace {

int decode_and_run(Context &ctx, Caller &caller, std::span<const std::byte> bytes)
{
	if (bytes.size() < sizeof(ib_uverbs_cmd_hdr))
		return refuse(EINVAL, "shorter than the command header");
	auto hdr = load<ib_uverbs_cmd_hdr>(bytes);
	if (hdr.command & ~(IB_USER_VERBS_CMD_FLAG_EXTENDED | IB_USER_VERBS_CMD_COMMAND_MASK))
		return refuse(EINVAL, "undefined bits in the command number");
	uint32_t num = hdr.command & IB_USER_VERBS_CMD_COMMAND_MASK;
	bool extended = hdr.command & IB_USER_VERBS_CMD_FLAG_EXTENDED;

	Request req;
	req.extended = extended;
	const CommandSpec *spec;
	if (!extended) {
		if (hdr.in_words * 4u != bytes.size())
			return refuse(EINVAL, "in_words does not match the write's length");
		spec = &write_commands()[num];
		if (!spec->handler)
			return refuse(EOPNOTSUPP, "unknown command");
		if (abi_revision(ctx) < command_revision(num))
			return refuse(EOPNOTSUPP, "command newer than the driver ABI revision served (--abi)");
		auto payload = bytes.subspan(sizeof(hdr));
		if (payload.size() < spec->min_core_size)  // as the kernel's verify_hdr answers a short request
			return refuse(ENOSPC, "short request: less than the command's core struct");
		// A private command that grew: an older caller's shorter struct
		// reads as zeros (load() fills them).
		size_t core = std::min(payload.size(), spec->core_size);
		req.core = payload.first(core);
		req.driver = payload.subspan(core);
		req.resp_len = hdr.out_words * 4u;
		req.core_resp_len = req.resp_len;
		if (spec->has_response)
			req.response = load<uint64_t>(payload);
		else if (hdr.out_words)
			return refuse(EINVAL, "room for a response the command does not have");
	} else {
		if (bytes.size() < sizeof(hdr) + sizeof(ib_uverbs_ex_cmd_hdr))
			return refuse(EINVAL, "shorter than the extended command header");
		auto ex = load<ib_uverbs_ex_cmd_hdr>(bytes.subspan(sizeof(hdr)));
		if (ex.cmd_hdr_reserved)
			return refuse(EINVAL, "non-zero reserved field in the extended header");
		auto payload = bytes.subspan(sizeof(hdr) + sizeof(ex));
		size_t core_in = hdr.in_words * 8u, drv_in = ex.provider_in_words * 8u;
		if (core_in + drv_in != payload.size())
			return refuse(EINVAL, "in_words + provider_in_words do not match the write's length");
		spec = &ex_commands()[num];
		if (!spec->handler)
			return refuse(EOPNOTSUPP, "unknown extended command");
		if (core_in < spec->min_core_size)
			return refuse(ENOSPC, "short request: less than the command's core struct");
		// A response pointer and room for a response come together or not at all.
		if ((ex.response != 0) != (hdr.out_words != 0 || ex.provider_out_words != 0))
			return refuse(EINVAL, "a response pointer and room for a response disagree");
		// A newer caller's longer core struct must be zero past what we know;
		// an older caller's shorter one reads as zeros (load() fills them).
		size_t known = std::min(core_in, spec->core_size);
		if (!all_zero(payload.subspan(known, core_in - known)))
			return refuse(EOPNOTSUPP, "non-zero core struct bytes past what this daemon knows");
		req.core = payload.first(known);
		req.driver = payload.subspan(core_in);
		req.response = ex.response;
		req.core_resp_len = hdr.out_words * 8u;
		req.resp_len = req.core_resp_len + ex.provider_out_words * 8u;
	}

	if (!ctx.device)
		return refuse(EIO, "the device was removed under this context");
	if (!ctx.initialised && !(num == IB_USER_VERBS_CMD_GET_CONTEXT && !extended))
		return refuse(EINVAL, "no GET_CONTEXT yet");
	return spec->handler(ctx, caller, req);
}

}  // namespace

// Dependency order: what uses an object goes before it. A shared XRC
// receive QP survives while other contexts hold it; an XRC domain while
// other contexts hold handles on it.
void destroy_context_objects(Context &ctx)
{
	release_all<Qp>(ctx, release_qp);
	release_all<Mw>(ctx, release_mw);
	release_all<Srq>(ctx, release_srq);
	release_all<Ah>(ctx, release_ah);
	release_all<Cq>(ctx, release_cq);
	release_all<Mr>(ctx, release_mr);
	release_all<Pd>(ctx, release_pd);
	release_all<Xrcd>(ctx, release_xrcd);
	ctx.objects.clear();
	ctx.channels.clear();
	ctx.channel_pool.clear();
	ctx.async_wr = unique_fd();
	ctx.async_rd = unique_fd();
	uncount_eager_cq_heads(ctx);
}

}  // namespace xsrc
