// The kernel behind ufab_stream_wait (docs/gpu.md, "Stream-ordered
// operations"): one thread reads a completion word of pinned host memory
// with system-scope acquire loads until it reaches `value` (the difference
// read as signed, so the wait survives the 32-bit sequence wrapping), then
// the kernel ends and the stream goes on. Hand-written PTX (ISA 7.0, sm_70
// and later: ld.acquire needs Volta); checked with
// `ptxas -arch=sm_90 wait_kernel.ptx` (tests/gpu/run.sh does not need it).
#pragma once

namespace ufab::stream {

inline constexpr char kWaitKernelName[] = "ufab_stream_wait_geq";
inline constexpr char kWaitKernelPtx[] = R"ptx(
.version 7.0
.target sm_70
.address_size 64

.visible .entry ufab_stream_wait_geq(
	.param .u64 ufab_stream_wait_geq_word,
	.param .u32 ufab_stream_wait_geq_value
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<4>;
	.reg .b64 	%rd<3>;

	ld.param.u64 	%rd1, [ufab_stream_wait_geq_word];
	ld.param.u32 	%r1, [ufab_stream_wait_geq_value];
	cvta.to.global.u64 	%rd2, %rd1;
$L_poll:
	ld.acquire.sys.global.u32 	%r2, [%rd2];
	sub.s32 	%r3, %r2, %r1;
	setp.lt.s32 	%p1, %r3, 0;
	@%p1 bra 	$L_poll;
	ret;
}
)ptx";

}  // namespace ufab::stream
