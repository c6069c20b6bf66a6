// XRC domains: OPEN_XRCD and CLOSE_XRCD. A domain is a device-wide object
// (its id is what the arena's QP and SRQ entries carry); contexts hold
// handles on it. OPEN_XRCD with fd -1 makes a private domain; with a file it
// finds or makes the device's domain of that file (named by its inode), so
// that processes which open the same file share one domain. The domain lives
// while any context holds a handle; a dying context releases its handles.
// The XRC objects themselves are in qp_commands.cpp and srq_commands.cpp.
#include <fcntl.h>
#include <sys/stat.h>

#include "dispatcher_handlers.h"

namespace xsrc {
namespace {

constexpr uint32_t kNoFd = 0xffffffffu;
// The flags of open(2) that mean something here (the access mode is
// accepted and ignored); anything else is refused.
constexpr uint32_t kKnownOflags = O_ACCMODE | O_CREAT | O_EXCL;

// Ids count up and wrap, so that a freed id is not reused at once.
XrcdId allocate_xrcd_id(Device &dev)
{
	uint32_t id = dev.next_xrcd_id;
	while (id == 0 || dev.xrcds.count(XrcdId(id)))
		id = id == UINT32_MAX ? 1 : id + 1;
	dev.next_xrcd_id = id == UINT32_MAX ? 1 : id + 1;
	return XrcdId(id);
}

}  // namespace

// As the kernel (ib_uverbs_open_xrcd): a file with no domain yet needs
// O_CREAT (EAGAIN without it); O_EXCL refuses a file that has one (EINVAL).
int cmd_open_xrcd(Context &ctx, Caller &caller, const Request &req)
{
	auto cmd = load<ib_uverbs_open_xrcd>(req.core);
	if (cmd.oflags & ~kKnownOflags)
		return refuse(EINVAL, "unknown oflags");
	if (int err = check_no_driver_data(req))
		return err;
	Device &dev = *ctx.device;

	std::optional<std::pair<dev_t, ino_t>> inode;
	unique_fd file;
	XrcdId xrcd_id;  // XrcdId() (0): a new domain
	if (cmd.fd != kNoFd) {
		if (cmd.fd > INT32_MAX)
			return refuse(EBADF, "bad fd number");
		file = unique_fd(caller.take_fd(static_cast<int>(cmd.fd)));
		if (!file)
			return refuse(EBADF, "the caller has no such fd");
		struct stat st;
		if (fstat(file.get(), &st))
			return refuse(EBADF, "cannot stat the fd");
		inode = std::pair{st.st_dev, st.st_ino};
		auto it = dev.xrcds_by_inode.find(*inode);
		if (it == dev.xrcds_by_inode.end() && !(cmd.oflags & O_CREAT))
			return refuse(EAGAIN, "no XRC domain for this file, and no O_CREAT");
		if (it != dev.xrcds_by_inode.end() && (cmd.oflags & O_EXCL))
			return refuse(EINVAL, "O_EXCL and the file has an XRC domain");
		if (it != dev.xrcds_by_inode.end())
			xrcd_id = it->second;
	}
	bool create = xrcd_id == XrcdId();
	if (create && dev.xrcds.size() >= DeviceLimits::max_xrcd)
		return refuse(ENOMEM, "limit: max_xrcd XRC domains on the device");
	if (create)
		xrcd_id = allocate_xrcd_id(dev);

	ib_uverbs_open_xrcd_resp resp{};
	if (int err = insert_object(ctx, Xrcd{xrcd_id, 0}, resp.xrcd_handle))
		return err;
	if (int err = respond(caller, req, as_bytes_of(resp))) {
		erase_object(ctx, resp.xrcd_handle);
		return err;
	}
	Device::XrcDomain &domain = dev.xrcds[xrcd_id];
	if (create) {
		domain.inode = inode;
		if (inode) {
			// Held while the domain lives, as the kernel holds the inode.
			domain.file = std::make_shared<unique_fd>(std::move(file));
			dev.xrcds_by_inode[*inode] = xrcd_id;
		}
	}
	++domain.handles;
	return 0;
}

// EBUSY while XRC SRQs or XRC receive QP handles of this context use the
// handle (the kernel's per-handle reference count); other handles on the
// same domain, here or in other contexts, do not matter.
int cmd_close_xrcd(Context &ctx, Caller &, const Request &req)
{
	auto cmd = load<ib_uverbs_close_xrcd>(req.core);
	Xrcd *xrcd = lookup<Xrcd>(ctx, cmd.xrcd_handle);
	if (!xrcd)
		return refuse(EINVAL, "no such XRC domain handle");
	if (xrcd->use_count)
		return refuse(EBUSY, "still in use");
	release_xrcd(ctx, cmd.xrcd_handle);
	return 0;
}

// The last handle on a domain destroys it: a later OPEN_XRCD of its file
// needs O_CREAT again and gets a new id.
void release_xrcd(Context &ctx, uint32_t handle)
{
	Xrcd *xrcd = lookup<Xrcd>(ctx, handle);
	if (!xrcd)
		return;
	if (Device *dev = ctx.device) {
		auto it = dev->xrcds.find(xrcd->xrcd_id);
		if (it != dev->xrcds.end() && --it->second.handles == 0) {
			if (it->second.inode)
				dev->xrcds_by_inode.erase(*it->second.inode);
			dev->xrcds.erase(it);
		}
	}
	erase_object(ctx, handle);
}

}  // namespace xsrc
