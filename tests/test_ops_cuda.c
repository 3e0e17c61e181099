/* test_ops_cuda.c: placeholder (being written). */
int main(void) { return 77; }
