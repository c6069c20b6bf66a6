// The RC endpoint's atomics: 64-bit fetch-and-add and compare-and-swap are the device's; the
// other operations, and every 32-bit one, are compare-and-swap loops on the aligned 64-bit word.
#include "rc_iface.h"

namespace xsrc::uct {

namespace {

uint64_t uct_xsrc_rc_ep_atomic_apply(const TxOp &op, uint64_t old64, bool *changes)
{
	uint64_t mask = op.bits == 64 ? ~uint64_t{0} : uint64_t{0xffffffff};
	uint64_t field = (old64 >> op.shift) & mask;
	uint64_t nf = field;
	*changes = true;
	switch (op.aop) {
	case UCT_ATOMIC_OP_ADD: nf = field + op.operand; break;
	case UCT_ATOMIC_OP_AND: nf = field & op.operand; break;
	case UCT_ATOMIC_OP_OR: nf = field | op.operand; break;
	case UCT_ATOMIC_OP_XOR: nf = field ^ op.operand; break;
	case UCT_ATOMIC_OP_SWAP: nf = op.operand; break;
	case UCT_ATOMIC_OP_CSWAP:
		if (field != (op.compare & mask))
			*changes = false;
		else
			nf = op.operand;
		break;
	default: break;
	}
	nf &= mask;
	return (old64 & ~(mask << op.shift)) | (nf << op.shift);
}

ucs_status_t uct_xsrc_rc_ep_atomic_post_cswap(Ep *ep, TxOp *op, uint64_t compare, uint64_t swap)
{
	return uct_xsrc_rc_ep_post_word(ep, op, IBV_WR_ATOMIC_CMP_AND_SWP, op->remote_word, op->rkey, compare, swap);
}

// Starts an atomic: 64-bit ADD and CSWAP are the device's; the rest (AND, OR, XOR, SWAP, and
// every 32-bit op on its aligned 64-bit word) are compare-and-swap loops. Atomic with respect
// to the device's atomics (IBV_ATOMIC_HCA) and so to every shim user.
ucs_status_t uct_xsrc_rc_ep_atomic_start(uct_ep_h tl_ep, uct_atomic_op_t aop, unsigned bits, uint64_t operand, uint64_t compare,
			  uint64_t remote_addr, uct_rkey_t rkey, void *result, uct_completion_t *comp)
{
	Ep *ep = ep_of(tl_ep);
	Iface *i = ep->iface;
	if (i->md->dev_attr.atomic_cap == IBV_ATOMIC_NONE)
		return UCS_ERR_UNSUPPORTED;
	if (aop >= UCT_ATOMIC_OP_LAST)
		return UCS_ERR_INVALID_PARAM;
	if ((bits == 64 && (remote_addr & 7)) || (bits == 32 && (remote_addr & 3)))
		return UCS_ERR_INVALID_PARAM;
	ucs_status_t st = uct_xsrc_rc_ep_tx_check(ep, false);
	if (st != UCS_OK)
		return st;
	bool native = bits == 64 && (aop == UCT_ATOMIC_OP_ADD || aop == UCT_ATOMIC_OP_CSWAP);
	TxOp *op = uct_xsrc_rc_iface_op_get(i, native ? (aop == UCT_ATOMIC_OP_ADD ? OpKind::atomic_fadd : OpKind::atomic_cswap)
				    : OpKind::atomic_emul,
			  ep);
	op->aop = aop;
	op->bits = bits;
	op->shift = bits == 32 ? static_cast<unsigned>((remote_addr & 4) * 8) : 0;
	op->operand = operand;
	op->compare = compare;
	op->remote_word = remote_addr & ~uint64_t{7};
	op->rkey = static_cast<uint32_t>(rkey);
	op->result = result;
	op->comp = comp;
	if (!native) {
		// First guess: the word is 0. A wrong guess costs one round trip and teaches the value.
		op->expect = 0;
		bool changes;
		st = uct_xsrc_rc_ep_atomic_post_cswap(ep, op, 0, uct_xsrc_rc_ep_atomic_apply(*op, 0, &changes));
	} else if (aop == UCT_ATOMIC_OP_CSWAP) {
		st = uct_xsrc_rc_ep_atomic_post_cswap(ep, op, compare, operand);
	} else {
		st = uct_xsrc_rc_ep_post_word(ep, op, IBV_WR_ATOMIC_FETCH_AND_ADD, op->remote_word, op->rkey, operand, 0);
	}
	if (st != UCS_OK) {
		uct_xsrc_rc_iface_op_put(i, op);
		return st;
	}
	return result ? UCS_INPROGRESS : UCS_OK;
}

}  // namespace

bool uct_xsrc_rc_ep_atomic_done(Ep *ep, TxOp *op, uint64_t word, ucs_status_t *st)
{
	if (*st != UCS_OK)
		return false;
	if (word != op->expect) {
		// Lost the race (or guessed wrong): go round again from the value seen.
		bool changes;
		uint64_t next = uct_xsrc_rc_ep_atomic_apply(*op, word, &changes);
		op->expect = word;
		if (!changes) {
			// A compare-and-swap whose compare fails: the seen value is the answer.
		} else if (uct_xsrc_rc_ep_atomic_post_cswap(ep, op, word, next) == UCS_OK) {
			return true;
		} else {
			*st = UCS_ERR_IO_ERROR;
		}
	}
	if (*st == UCS_OK && op->result) {
		uint64_t field = (word >> op->shift) & (op->bits == 64 ? ~uint64_t{0} : 0xffffffffull);
		if (op->bits == 64)
			*static_cast<uint64_t *>(op->result) = field;
		else
			*static_cast<uint32_t *>(op->result) = static_cast<uint32_t>(field);
	}
	return false;
}

ucs_status_t uct_xsrc_rc_ep_atomic_cswap64(uct_ep_h ep, uint64_t compare, uint64_t swap, uint64_t remote_addr, uct_rkey_t rkey,
				  uint64_t *result, uct_completion_t *comp)
{
	if (!result)
		return UCS_ERR_INVALID_PARAM;
	return uct_xsrc_rc_ep_atomic_start(ep, UCT_ATOMIC_OP_CSWAP, 64, swap, compare, remote_addr, rkey, result, comp);
}

ucs_status_t uct_xsrc_rc_ep_atomic_cswap32(uct_ep_h ep, uint32_t compare, uint32_t swap, uint64_t remote_addr, uct_rkey_t rkey,
				  uint32_t *result, uct_completion_t *comp)
{
	if (!result)
		return UCS_ERR_INVALID_PARAM;
	return uct_xsrc_rc_ep_atomic_start(ep, UCT_ATOMIC_OP_CSWAP, 32, swap, compare, remote_addr, rkey, result, comp);
}

ucs_status_t uct_xsrc_rc_ep_atomic32_post(uct_ep_h ep, unsigned opcode, uint32_t value, uint64_t remote_addr, uct_rkey_t rkey)
{
	if (opcode == UCT_ATOMIC_OP_SWAP || opcode == UCT_ATOMIC_OP_CSWAP)
		return UCS_ERR_UNSUPPORTED;
	return uct_xsrc_rc_ep_atomic_start(ep, static_cast<uct_atomic_op_t>(opcode), 32, value, 0, remote_addr, rkey, nullptr, nullptr);
}

ucs_status_t uct_xsrc_rc_ep_atomic64_post(uct_ep_h ep, unsigned opcode, uint64_t value, uint64_t remote_addr, uct_rkey_t rkey)
{
	if (opcode == UCT_ATOMIC_OP_SWAP || opcode == UCT_ATOMIC_OP_CSWAP)
		return UCS_ERR_UNSUPPORTED;
	return uct_xsrc_rc_ep_atomic_start(ep, static_cast<uct_atomic_op_t>(opcode), 64, value, 0, remote_addr, rkey, nullptr, nullptr);
}

ucs_status_t uct_xsrc_rc_ep_atomic32_fetch(uct_ep_h ep, unsigned opcode, uint32_t value, uint32_t *result,
				  uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t *comp)
{
	if (!result || opcode == UCT_ATOMIC_OP_CSWAP)
		return UCS_ERR_INVALID_PARAM;
	return uct_xsrc_rc_ep_atomic_start(ep, static_cast<uct_atomic_op_t>(opcode), 32, value, 0, remote_addr, rkey, result, comp);
}

ucs_status_t uct_xsrc_rc_ep_atomic64_fetch(uct_ep_h ep, unsigned opcode, uint64_t value, uint64_t *result,
				  uint64_t remote_addr, uct_rkey_t rkey, uct_completion_t *comp)
{
	if (!result || opcode == UCT_ATOMIC_OP_CSWAP)
		return UCS_ERR_INVALID_PARAM;
	return uct_xsrc_rc_ep_atomic_start(ep, static_cast<uct_atomic_op_t>(opcode), 64, value, 0, remote_addr, rkey, result, comp);
}


}  // namespace xsrc::uct
