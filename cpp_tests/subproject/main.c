/* The parent project's own program, linked to xlog::cuda from add_subdirectory. */
#include <stdio.h>
#include <xlog_cuda.h>

int main(void) {
  xlog_config cfg;
  xlog_config_init(&cfg);
  cfg.backend = XLOG_BACKEND_SIM;
  xlog_runtime *rt = NULL;
  if (xlog_runtime_open(0, &cfg, &rt) != XLOG_OK) return 1;
  printf("parent_app OK: libxlog_cuda %s\n", xlog_version());
  return xlog_runtime_close(rt) == XLOG_OK ? 0 : 1;
}
