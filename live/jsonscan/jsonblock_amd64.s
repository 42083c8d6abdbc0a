//go:build amd64 && !purego

#include "textflag.h"

// Nibble tables for the bytes that may follow a backslash in a JSON
// string (RFC 8259 section 7): " / \ b f n r t u. A byte is one of them
// when escLo[its low nibble] & escHi[its high nibble] != 0; each bit of
// an entry stands for one high nibble: 1 for 0x2_, 2 for 0x5_, 4 for
// 0x6_, 8 for 0x7_.
DATA escLo<>+0(SB)/8, $0x00040808000D0000
DATA escLo<>+8(SB)/8, $0x0104000200000000
GLOBL escLo<>(SB), RODATA|NOPTR, $16
DATA escHi<>+0(SB)/8, $0x0804020000010000
DATA escHi<>+8(SB)/8, $0x0000000000000000
GLOBL escHi<>(SB), RODATA|NOPTR, $16

// func blockMasksAVX2(d []byte, off int, out *[blockBatch]blockMask) (next, n int)
TEXT ·blockMasksAVX2(SB), NOSPLIT, $0-56
	MOVQ d_base+0(FP), SI
	MOVQ d_len+8(FP), DX
	MOVQ off+24(FP), AX
	MOVQ out+32(FP), DI
	MOVQ $0x22, BX
	MOVQ BX, X8
	VPBROADCASTB X8, Y8   // '"'
	MOVQ $0x5c, BX
	MOVQ BX, X9
	VPBROADCASTB X9, Y9   // '\\'
	MOVQ $0x1f, BX
	MOVQ BX, X10
	VPBROADCASTB X10, Y10 // the highest control byte

	// Skip the blocks with no '"', '\\' or control byte.
skip:
	LEAQ 64(AX), BX
	CMPQ BX, DX
	JGT  tail
	VMOVDQU (SI)(AX*1), Y0
	VMOVDQU 32(SI)(AX*1), Y1
	VPCMPEQB Y8, Y0, Y2
	VPCMPEQB Y8, Y1, Y3
	VPCMPEQB Y9, Y0, Y4
	VPCMPEQB Y9, Y1, Y5
	VPMINUB  Y10, Y0, Y6
	VPCMPEQB Y6, Y0, Y6
	VPMINUB  Y10, Y1, Y7
	VPCMPEQB Y7, Y1, Y7
	VPOR     Y2, Y3, Y11
	VPOR     Y4, Y11, Y11
	VPOR     Y5, Y11, Y11
	VPOR     Y6, Y11, Y11
	VPOR     Y7, Y11, Y11
	VPTEST   Y11, Y11
	JNZ      found
	MOVQ     BX, AX
	JMP      skip

tail:
	MOVQ AX, next+40(FP)
	MOVQ $0, n+48(FP)
	VZEROUPPER
	RET

found:
	MOVQ AX, next+40(FP)
	XORQ CX, CX
	MOVQ $0x0f, BX
	MOVQ BX, X11
	VPBROADCASTB X11, Y11 // the low nibble
	VBROADCASTI128 escLo<>(SB), Y12
	VBROADCASTI128 escHi<>(SB), Y13
	MOVQ $0x75, BX
	MOVQ BX, X14
	VPBROADCASTB X14, Y14 // 'u'

	// Classify this block and those after it.
block:
	VMOVDQU (SI)(AX*1), Y0
	VMOVDQU 32(SI)(AX*1), Y1

	VPCMPEQB  Y8, Y0, Y2 // q
	VPCMPEQB  Y8, Y1, Y3
	VPMOVMSKB Y2, R8
	VPMOVMSKB Y3, R9
	SHLQ      $32, R9
	ORQ       R9, R8
	MOVQ      R8, 0(DI)

	VPCMPEQB  Y9, Y0, Y2 // b
	VPCMPEQB  Y9, Y1, Y3
	VPMOVMSKB Y2, R8
	VPMOVMSKB Y3, R9
	SHLQ      $32, R9
	ORQ       R9, R8
	MOVQ      R8, 8(DI)

	VPMINUB   Y10, Y0, Y2 // c
	VPCMPEQB  Y2, Y0, Y2
	VPMINUB   Y10, Y1, Y3
	VPCMPEQB  Y3, Y1, Y3
	VPMOVMSKB Y2, R8
	VPMOVMSKB Y3, R9
	SHLQ      $32, R9
	ORQ       R9, R8
	MOVQ      R8, 16(DI)

	VPAND     Y11, Y0, Y2 // v: the nibble tables agree
	VPSHUFB   Y2, Y12, Y2
	VPSRLW    $4, Y0, Y3
	VPAND     Y11, Y3, Y3
	VPSHUFB   Y3, Y13, Y3
	VPAND     Y2, Y3, Y2
	VPAND     Y11, Y1, Y4
	VPSHUFB   Y4, Y12, Y4
	VPSRLW    $4, Y1, Y5
	VPAND     Y11, Y5, Y5
	VPSHUFB   Y5, Y13, Y5
	VPAND     Y4, Y5, Y4
	VPXOR     Y6, Y6, Y6
	VPCMPEQB  Y6, Y2, Y2 // 0xff: not one of them
	VPCMPEQB  Y6, Y4, Y4
	VPMOVMSKB Y2, R8
	VPMOVMSKB Y4, R9
	SHLQ      $32, R9
	ORQ       R9, R8
	NOTQ      R8
	MOVQ      R8, 24(DI)

	VPCMPEQB  Y14, Y0, Y2 // u
	VPCMPEQB  Y14, Y1, Y3
	VPMOVMSKB Y2, R8
	VPMOVMSKB Y3, R9
	SHLQ      $32, R9
	ORQ       R9, R8
	MOVQ      R8, 32(DI)

	ADDQ $40, DI
	INCQ CX
	ADDQ $64, AX
	CMPQ CX, $8 // blockBatch
	JGE  done
	LEAQ 64(AX), BX
	CMPQ BX, DX
	JLE  block

done:
	MOVQ CX, n+48(FP)
	VZEROUPPER
	RET

// func asciiPrefixAVX2(d []byte) int
TEXT ·asciiPrefixAVX2(SB), NOSPLIT, $0-32
	MOVQ d_base+0(FP), SI
	MOVQ d_len+8(FP), DX
	XORQ AX, AX

ascii:
	LEAQ      128(AX), BX
	CMPQ      BX, DX
	JGT       asciiDone
	VMOVDQU   (SI)(AX*1), Y0
	VPOR      32(SI)(AX*1), Y0, Y0
	VPOR      64(SI)(AX*1), Y0, Y0
	VPOR      96(SI)(AX*1), Y0, Y0
	VPMOVMSKB Y0, CX // the high bits: a byte >= 0x80
	TESTL     CX, CX
	JNZ       asciiDone
	MOVQ      BX, AX
	JMP       ascii

asciiDone:
	MOVQ AX, ret+24(FP)
	VZEROUPPER
	RET
