# Guest for tests/vmm/pci_dma.rs: drives the kore-dma PCI test device from ring 0.
# Rebuild the bytes there with: as pci_guest.s -o g.o && objcopy -O binary -j .text g.o g.bin
# Exits (port 0xf4) with 0x600d on success, else the number of the failed check.
.intel_syntax noprefix
.code64
start:
    mov rbx, 0xe0000000          # ECAM, device 0
    mov eax, [rbx]
    cmp eax, 0x4b441234
    mov edi, 0x10
    jne fail
    mov r12d, [rbx+0x10]         # BAR0
    mov r13d, [rbx+0x18]         # BAR2
    # BAR sizing of BAR0: all-ones, read, restore
    mov dword ptr [rbx+0x10], 0xffffffff
    mov eax, [rbx+0x10]
    mov [rbx+0x10], r12d
    cmp eax, 0xfffff000
    mov edi, 0x11
    jne fail
    movzx ecx, byte ptr [rbx+0x34]   # MSI-X capability
    mov word ptr [rbx+4], 6          # Memory Space + Bus Master
    mov eax, [r12]
    cmp eax, 0x414d444b
    mov edi, 0x12
    jne fail
    mov dword ptr [r13], 0xfee00000
    mov dword ptr [r13+4], 0
    mov dword ptr [r13+8], 0x40
    mov dword ptr [r13+12], 0
    mov word ptr [rbx+rcx+2], 0x8000 # MSI-X Enable
    # source data at 16 MiB
    mov rax, 0x1122334455667788
    mov rsi, 0x1000000
    mov [rsi], rax
    mov [rsi+8], rax
    mov qword ptr [r12+0x08], rsi
    mov rdx, 0x1100008
    mov qword ptr [r12+0x10], rdx
    mov qword ptr [r12+0x18], 16
    mov dword ptr [r12+0x20], 1
    mov eax, [r12+0x24]
    cmp eax, 2
    mov edi, 0x13
    jne fail
    mov rax, [rdx+8]
    cmp rax, [rsi]
    mov edi, 0x14
    jne fail
    # wait for vector 0x40 in the LAPIC IRR (interrupts are off)
    mov r8, 0xfee00220
    mov ecx, 2000000
1:  test dword ptr [r8], 1
    jnz 2f
    pause
    dec ecx
    jnz 1b
    mov edi, 0x15
    jmp fail
2:
    # misbehaviour: garbage MSI-X entry, DMA into the device window and past RAM
    mov dword ptr [r13], 0xdeadbeef
    mov dword ptr [r13+4], 0xffffffff
    mov rdx, 0xc0000000
    mov qword ptr [r12+0x10], rdx
    mov dword ptr [r12+0x20], 1
    mov eax, [r12+0x28]
    cmp eax, 2
    mov edi, 0x16
    jne fail
    mov rdx, 0x7ffffff8
    mov qword ptr [r12+0x08], rdx
    mov dword ptr [r12+0x20], 1
    mov eax, [r12+0x28]
    cmp eax, 1
    mov edi, 0x17
    jne fail
    mov dword ptr [rbx+0x10], 0x12345678   # a BAR moved out of the window
    mov dword ptr [r12+0x20], 1            # goes nowhere now
    mov rax, [r12+0x30]
    mov edi, 0x600d
    mov [rbx+0x10], r12d                   # restore
    mov rax, [r12+0x30]
    cmp rax, 3
    je done
    mov edi, 0x18
fail:
done:
    mov eax, edi
    mov dx, 0xf4
    out dx, eax
3:  hlt
    jmp 3b
