// A thin C ABI over UDT4 (Debian libudt-dev) for tern-bench's stream driver.
// Every function returns -1 on error (tb_udt_error() says why); recv returns -2 on a
// receive timeout. Linger is off: the harness closes only after the peer has what it needs.
#include <udt/udt.h>
#include <arpa/inet.h>
#include <cstring>

static int mkaddr(const char* ip, int port, sockaddr_in* a) {
  std::memset(a, 0, sizeof *a);
  a->sin_family = AF_INET;
  a->sin_port = htons((unsigned short)port);
  return inet_pton(AF_INET, ip, &a->sin_addr) == 1 ? 0 : -1;
}

static void tune(UDTSOCKET s) {
  linger l;
  l.l_onoff = 0;
  l.l_linger = 0;
  UDT::setsockopt(s, 0, UDT_LINGER, &l, sizeof l);
}

extern "C" {
int tb_udt_startup() { return UDT::startup(); }

int tb_udt_listen(const char* ip, int port, int* bound_port) {
  UDTSOCKET s = UDT::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a;
  if (mkaddr(ip, port, &a)) return -1;
  tune(s);
  if (UDT::bind(s, (sockaddr*)&a, sizeof a) == UDT::ERROR) return -1;
  if (UDT::listen(s, 1024) == UDT::ERROR) return -1;
  int len = sizeof a;
  UDT::getsockname(s, (sockaddr*)&a, &len);
  *bound_port = ntohs(a.sin_port);
  return s;
}

int tb_udt_accept(int ls) {
  sockaddr_in a;
  int len = sizeof a;
  UDTSOCKET s = UDT::accept(ls, (sockaddr*)&a, &len);
  if (s == UDT::INVALID_SOCK) return -1;
  tune(s);
  return s;
}

int tb_udt_connect(const char* ip, int port, const char* bind_ip) {
  UDTSOCKET s = UDT::socket(AF_INET, SOCK_STREAM, 0);
  tune(s);
  if (bind_ip && *bind_ip) {
    sockaddr_in b;
    if (mkaddr(bind_ip, 0, &b) || UDT::bind(s, (sockaddr*)&b, sizeof b) == UDT::ERROR) {
      UDT::close(s);
      return -1;
    }
  }
  sockaddr_in a;
  if (mkaddr(ip, port, &a) || UDT::connect(s, (sockaddr*)&a, sizeof a) == UDT::ERROR) {
    UDT::close(s);
    return -1;
  }
  return s;
}

int tb_udt_send(int s, const char* buf, int len) {
  int n = UDT::send(s, buf, len, 0);
  return n == UDT::ERROR ? -1 : n;
}

int tb_udt_recv(int s, char* buf, int len) {
  int n = UDT::recv(s, buf, len, 0);
  if (n == UDT::ERROR) {
    int code = UDT::getlasterror().getErrorCode();
    if (code == 6002 || code == 6003) return -2;  // EASYNCRCV, ETIMEOUT
    return -1;
  }
  return n;
}

int tb_udt_set_rcvtimeo(int s, int ms) {
  return UDT::setsockopt(s, 0, UDT_RCVTIMEO, &ms, sizeof ms) == UDT::ERROR ? -1 : 0;
}

int tb_udt_close(int s) { return UDT::close(s) == UDT::ERROR ? -1 : 0; }

const char* tb_udt_error() { return UDT::getlasterror().getErrorMessage(); }
}
