/* Exercises port and MMIO exits both ways and the host's view of guest memory,
 * using the debug devices (sandcell-vmm --debug-devices). Prints one line per
 * check ("... ok" or "... FAIL"), then powers off. */
    .include "common.inc"
    .set SCRATCH, 0x0
    .set ADDRESS, 0x4
    .set PEEK, 0x8
    .set PATTERN, 0x5a17c0de
    .set MEM_A, 0x02000000      /* 32 MiB */
    .set MEM_B, 0x07fff000      /* the last page of a 128 MiB guest */
    .text
    .globl _start
_start:
    /* 1. PIO: the scratch register reads back inverted. */
    mov $DEBUG_PORT + SCRATCH, %dx
    mov $PATTERN, %eax
    outl %eax, %dx
    inl %dx, %eax
    not %eax
    cmp $PATTERN, %eax
    lea pio_fail(%rip), %rsi
    jne 1f
    lea pio_ok(%rip), %rsi
1:  call puts

    /* 2. MMIO: the same through the MMIO copy of the device. */
    mov $DEBUG_MMIO, %rdi
    movl $~PATTERN, SCRATCH(%rdi)
    movl SCRATCH(%rdi), %eax
    cmp $PATTERN, %eax
    lea mmio_fail(%rip), %rsi
    jne 1f
    lea mmio_ok(%rip), %rsi
1:  call puts

    /* 3. Memory: write patterns, let the VMM read them back through its mapping. */
    movl $PATTERN, MEM_A
    movl $~PATTERN, MEM_B
    mov $DEBUG_PORT + ADDRESS, %dx
    mov $MEM_A, %eax
    outl %eax, %dx
    mov $DEBUG_PORT + PEEK, %dx
    inl %dx, %eax
    cmp $PATTERN, %eax
    jne 2f
    mov $DEBUG_PORT + ADDRESS, %dx
    mov $MEM_B, %eax
    outl %eax, %dx
    mov $DEBUG_PORT + PEEK, %dx
    inl %dx, %eax
    cmp $~PATTERN, %eax
    jne 2f
    lea mem_ok(%rip), %rsi
    jmp 3f
2:  lea mem_fail(%rip), %rsi
3:  call puts

    /* 4. Nothing at a port or an MMIO address: reads return all ones. */
    mov $0x0600, %dx
    inb %dx, %al
    cmp $0xff, %al
    jne 4f
    mov $0xd8000000, %rdi
    movl (%rdi), %eax
    cmp $0xffffffff, %eax
    jne 4f
    movl $1, (%rdi)             /* ignored */
    lea unknown_ok(%rip), %rsi
    jmp 5f
4:  lea unknown_fail(%rip), %rsi
5:  call puts

    print done
    power_off
    .include "puts.inc"
pio_ok: .asciz "pio ok\n"
pio_fail: .asciz "pio FAIL\n"
mmio_ok: .asciz "mmio ok\n"
mmio_fail: .asciz "mmio FAIL\n"
mem_ok: .asciz "memory ok\n"
mem_fail: .asciz "memory FAIL\n"
unknown_ok: .asciz "unknown ok\n"
unknown_fail: .asciz "unknown FAIL\n"
done: .asciz "devices done\n"
