/*
 * gVisor (runsc 20240729, what Debian bookworm ships) answers close_range(2) with EINVAL when
 * `last` is above INT_MAX, and GLib closes a child's descriptors with
 * close_range(3, ~0U, 0) and no fallback for EINVAL: every process GLib spawns (xfce4-session
 * launching xfwm4, xfdesktop, the panel) then fails with "Failed to close file descriptor for
 * child process". No descriptor can be above INT_MAX, so capping `last` there asks the same
 * thing in a form gVisor takes. Preloaded in the desktop image (/etc/ld.so.preload); harmless
 * on a Linux kernel, which takes both.
 */
#define _GNU_SOURCE
#include <limits.h>
#include <sys/syscall.h>
#include <unistd.h>

int close_range(unsigned int first, unsigned int last, int flags)
{
	if (last > INT_MAX)
		last = INT_MAX;
	return (int)syscall(SYS_close_range, first, last, flags);
}
