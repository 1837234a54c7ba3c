/* A thin C ABI over libsrt (Debian libsrt-openssl-dev) for tern-bench's stream driver.
 * Sockets are in file mode (SRTT_FILE: stream API, file congestion control, no TSBPD),
 * which is the mode that fits request/response and bulk transfers. -1 on error, recv gives
 * -2 on a receive timeout. Linger is off, as for UDT. */
#include <srt/srt.h>
#include <arpa/inet.h>
#include <string.h>
#include <sys/socket.h>

static int mkaddr(const char* ip, int port, struct sockaddr_in* a) {
  memset(a, 0, sizeof *a);
  a->sin_family = AF_INET;
  a->sin_port = htons((unsigned short)port);
  return inet_pton(AF_INET, ip, &a->sin_addr) == 1 ? 0 : -1;
}

static SRTSOCKET mksock(void) {
  SRTSOCKET s = srt_create_socket();
  if (s == SRT_INVALID_SOCK) return s;
  int tt = SRTT_FILE;
  srt_setsockflag(s, SRTO_TRANSTYPE, &tt, sizeof tt);
  struct linger l = {0, 0};
  srt_setsockflag(s, SRTO_LINGER, &l, sizeof l);
  return s;
}

int tb_srt_startup(void) { return srt_startup(); }

int tb_srt_listen(const char* ip, int port, int* bound_port) {
  SRTSOCKET s = mksock();
  struct sockaddr_in a;
  if (s == SRT_INVALID_SOCK || mkaddr(ip, port, &a)) return -1;
  if (srt_bind(s, (struct sockaddr*)&a, sizeof a) == SRT_ERROR) return -1;
  if (srt_listen(s, 1024) == SRT_ERROR) return -1;
  int len = sizeof a;
  srt_getsockname(s, (struct sockaddr*)&a, &len);
  *bound_port = ntohs(a.sin_port);
  return s;
}

int tb_srt_accept(int ls) {
  struct sockaddr_in a;
  int len = sizeof a;
  SRTSOCKET s = srt_accept(ls, (struct sockaddr*)&a, &len);
  return s == SRT_INVALID_SOCK ? -1 : s;
}

int tb_srt_connect(const char* ip, int port, const char* bind_ip) {
  SRTSOCKET s = mksock();
  if (s == SRT_INVALID_SOCK) return -1;
  if (bind_ip && *bind_ip) {
    struct sockaddr_in b;
    if (mkaddr(bind_ip, 0, &b) || srt_bind(s, (struct sockaddr*)&b, sizeof b) == SRT_ERROR) {
      srt_close(s);
      return -1;
    }
  }
  struct sockaddr_in a;
  if (mkaddr(ip, port, &a) || srt_connect(s, (struct sockaddr*)&a, sizeof a) == SRT_ERROR) {
    srt_close(s);
    return -1;
  }
  return s;
}

int tb_srt_send(int s, const char* buf, int len) {
  int n = srt_send(s, buf, len);
  return n == SRT_ERROR ? -1 : n;
}

int tb_srt_recv(int s, char* buf, int len) {
  int n = srt_recv(s, buf, len);
  if (n == SRT_ERROR) {
    int code = srt_getlasterror(NULL);
    if (code == SRT_EASYNCRCV || code == SRT_ETIMEOUT) return -2;
    return -1;
  }
  return n;
}

int tb_srt_set_rcvtimeo(int s, int ms) {
  return srt_setsockflag(s, SRTO_RCVTIMEO, &ms, sizeof ms) == SRT_ERROR ? -1 : 0;
}

int tb_srt_close(int s) { return srt_close(s) == SRT_ERROR ? -1 : 0; }

const char* tb_srt_error(void) { return srt_getlasterror_str(); }
