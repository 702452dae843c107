//go:build amd64 && !race

#include "textflag.h"

// func copyNT(dst, src unsafe.Pointer, n uintptr)
// n is a multiple of 64 and dst is 16-byte aligned; src may be unaligned. MOVNTO is MOVNTDQ (SSE2, which
// every amd64 CPU has).
TEXT ·copyNT(SB), NOSPLIT, $0-24
	MOVQ	dst+0(FP), DI
	MOVQ	src+8(FP), SI
	MOVQ	n+16(FP), CX
	SHRQ	$6, CX
	JZ	done
loop:
	MOVOU	0(SI), X0
	MOVOU	16(SI), X1
	MOVOU	32(SI), X2
	MOVOU	48(SI), X3
	MOVNTO	X0, 0(DI)
	MOVNTO	X1, 16(DI)
	MOVNTO	X2, 32(DI)
	MOVNTO	X3, 48(DI)
	ADDQ	$64, SI
	ADDQ	$64, DI
	DECQ	CX
	JNZ	loop
done:
	SFENCE
	RET
