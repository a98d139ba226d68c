// A shared library that is not a ufab plugin: no entry symbol at all.
extern "C" __attribute__((visibility("default"))) int not_a_ufab_plugin(void) { return 1; }
