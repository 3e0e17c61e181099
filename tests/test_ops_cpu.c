/* test_ops_cpu.c: placeholder (being written). */
int main(void) { return 77; }
