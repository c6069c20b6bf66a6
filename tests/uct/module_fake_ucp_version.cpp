// A stand-in for libucp's version functions that reports UCX 1.14.0. Preloaded before
// libxsrc-uct.so.0 (module_ucx_info.sh), it makes the process look like a UCX other than
// 1.13: the shim must then stay out of UCX's component list while UCX itself keeps working.
extern "C" {

void ucp_get_version(unsigned *major, unsigned *minor, unsigned *release)
{
	*major = 1;
	*minor = 14;
	*release = 0;
}

const char *ucp_get_version_string() { return "1.14.0"; }

}
