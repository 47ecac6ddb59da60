/* The pod sandbox's process for the world's node: it holds the pod's namespaces open, reaps
 * the zombies of processes that share its pid namespace, and exits on SIGINT or SIGTERM.
 * The world builds it (static, no libc at run time) because the usual pause image lives in a
 * registry this machine cannot reach. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { _exit(128 + sig); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, 0, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction on_stop = {.sa_handler = stop};
  struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGINT, &on_stop, 0);
  sigaction(SIGTERM, &on_stop, 0);
  sigaction(SIGCHLD, &on_child, 0);
  for (;;) pause();
}
