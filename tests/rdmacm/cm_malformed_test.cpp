// Malformed rdma_cm commands written straight to a channel file of the
// daemon (not through librdmacm, whose header cannot sit beside the ABI's):
// each gets the kernel's errno, and the daemon serves on.
#include <fcntl.h>
#include <rdma/rdma_user_cm.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <gtest/gtest.h>
#include <string>

namespace xsrc_cm_test {
std::string cm_dir();  // cm_util.cpp
}

using xsrc_cm_test::cm_dir;

namespace {

// --- malformed commands -----------------------------------------------------------

class RawChannel {
public:
	RawChannel()
	{
		std::string dir = cm_dir();
		if (!dir.empty())
			fd_ = open((dir + "/channel").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	}
	~RawChannel()
	{
		if (fd_ >= 0)
			close(fd_);
	}
	int fd() const { return fd_; }
	// One write(): 0 or the errno it failed with.
	int write_cmd(const void *p, size_t n) const
	{
		ssize_t r = write(fd_, p, n);
		if (r < 0)
			return errno;
		return static_cast<size_t>(r) == n ? 0 : -1;
	}
	template <typename T>
	int command(uint32_t cmd, const T &body, uint16_t out) const
	{
		struct {
			rdma_ucm_cmd_hdr hdr;
			T body;
		} __attribute__((packed)) c{{cmd, sizeof(T), out}, body};
		return write_cmd(&c, sizeof(c));
	}
	// CREATE_ID; the id, or 0.
	uint32_t create_id() const
	{
		rdma_ucm_create_id_resp resp{};
		rdma_ucm_create_id c{};
		c.response = reinterpret_cast<uintptr_t>(&resp);
		c.ps = RDMA_PS_TCP;
		return command(RDMA_USER_CM_CMD_CREATE_ID, c, sizeof(resp)) == 0 ? resp.id : 0;
	}

private:
	int fd_ = -1;
};

TEST(CmMalformed, CommandsGetTheKernelsErrnoAndTheDaemonServesOn)
{
	RawChannel ch, other;
	ASSERT_GE(ch.fd(), 0) << "cannot open the channel file in " << cm_dir();
	ASSERT_GE(other.fd(), 0);
	rdma_ucm_cmd_hdr hdr{RDMA_USER_CM_CMD_CREATE_ID, 0, 0};
	EXPECT_EQ(ch.write_cmd(&hdr, 4), EINVAL) << "short header";
	hdr = {99, 0, 0};
	EXPECT_EQ(ch.write_cmd(&hdr, sizeof(hdr)), EINVAL) << "unknown command";
	rdma_ucm_get_event ge{};
	EXPECT_EQ(ch.command(RDMA_USER_CM_CMD_GET_OPTION, ge, 0), ENOSYS) << "GET_OPTION";
	struct {
		rdma_ucm_cmd_hdr hdr;
		uint64_t half;
	} shortin{{RDMA_USER_CM_CMD_CREATE_ID, sizeof(rdma_ucm_create_id), sizeof(rdma_ucm_create_id_resp)}, 0};
	EXPECT_EQ(ch.write_cmd(&shortin, sizeof(shortin)), EINVAL) << "in-length past the write";

	rdma_ucm_create_id_resp resp{};
	rdma_ucm_create_id create{};
	create.response = reinterpret_cast<uintptr_t>(&resp);
	create.ps = RDMA_PS_TCP;
	EXPECT_EQ(ch.command(RDMA_USER_CM_CMD_CREATE_ID, create, 2), ENOSPC) << "out too small";
	create.response = 8;  // nothing is mapped there
	EXPECT_EQ(ch.command(RDMA_USER_CM_CMD_CREATE_ID, create, sizeof(resp)), EFAULT) << "bad response address";

	rdma_ucm_destroy_id_resp dresp{};
	rdma_ucm_destroy_id destroy{};
	destroy.response = reinterpret_cast<uintptr_t>(&dresp);
	destroy.id = 0x7fff0000;
	EXPECT_EQ(ch.command(RDMA_USER_CM_CMD_DESTROY_ID, destroy, sizeof(dresp)), ENOENT) << "bad id";
	const uint32_t theirs = other.create_id();
	ASSERT_NE(theirs, 0u);
	destroy.id = theirs;
	EXPECT_EQ(ch.command(RDMA_USER_CM_CMD_DESTROY_ID, destroy, sizeof(dresp)), EINVAL) << "another channel's id";
	EXPECT_EQ(other.command(RDMA_USER_CM_CMD_DESTROY_ID, destroy, sizeof(dresp)), 0) << "its own channel's";

	// The daemon serves on: a real rping, server and client.
	int rc = system("timeout 30 rping -s -a 127.0.0.1 -p 19390 -C 3 -V >/dev/null 2>&1 & sleep 0.5; "
			"timeout 30 rping -c -a 127.0.0.1 -p 19390 -C 3 -V >/dev/null 2>&1 && wait $!");
	EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 0) << "rping after the malformed commands: " << rc;
}

}  // namespace
