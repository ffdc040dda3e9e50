/* Counts forever, in a register (rbx) and in memory (COUNTER), and prints
 * "count XXXXXXXX\n" (hex) after each step; a mismatch between the two copies prints
 * "MISMATCH" and halts. Before counting it fills FILL_LEN bytes at FILL with a pattern
 * and prints "ready"; every step reads one word from each page of that region, so a
 * restored VM touches (and shares, copy-on-write) those pages of its memory image.
 * Snapshot tests check that a restored copy continues the count instead of restarting. */
    .include "common.inc"
    .set COUNTER, 0x300000
    .set FILL, 0x400000
    .set FILL_LEN, 0x200000
    .text
    .globl _start
_start:
    mov $FILL, %rdi
    mov $FILL_LEN / 8, %rcx
    mov $0x5a5a5a5a5a5a5a5a, %rax
    rep stosq
    print ready
    xor %ebx, %ebx
    movq $0, COUNTER
next:
    inc %rbx
    incq COUNTER
    cmp COUNTER, %rbx
    jne mismatch
    mov $FILL, %rsi              /* touch every page of the filled region */
1:  mov (%rsi), %rax
    add $0x1000, %rsi
    cmp $FILL + FILL_LEN, %rsi
    jb 1b
    print prefix
    mov %ebx, %eax
    call puthex
    mov $'\n', %al
    mov $COM1, %dx
    outb %al, %dx
    mov $5000, %ecx               /* spin between lines */
2:  dec %ecx
    jnz 2b
    jmp next
mismatch:
    print bad
3:  hlt
    jmp 3b

/* puthex: eax as 8 hex digits on COM1. Clobbers eax, ecx, edx, edi. */
puthex:
    mov %eax, %edi
    mov $8, %ecx
1:  rol $4, %edi
    mov %edi, %eax
    and $0xf, %eax
    cmp $10, %al
    jb 2f
    add $('a' - '0' - 10), %al
2:  add $'0', %al
    mov $COM1, %dx
    outb %al, %dx
    dec %ecx
    jnz 1b
    ret
    .include "puts.inc"
ready: .asciz "ready\n"
prefix: .asciz "count "
bad: .asciz "MISMATCH\n"
