/* bench/tmpfs_costs.c: what 100 MiB costs on this machine, three times:
 * pwrite into a new /dev/shm file in 512 KiB batches (copy into a buffer
 * first, as the checkpoint does), pread it back; a shared mapping of a new
 * /dev/shm file populated with MADV_POPULATE_WRITE, a memcpy into it, its
 * munmap; the same for anonymous memory (what restore's target pays);
 * fallocate of a new /dev/shm file then the same pwrite; and a plain
 * memcpy of 100 MiB between two buffers already backed (the copy's own
 * speed, no page allocation).
 * cc -O2 -o /tmp/tmpfs_costs bench/tmpfs_costs.c && /tmp/tmpfs_costs */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>
#include <time.h>
#define SZ (100ul<<20)
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec/1e6;}
int main(){
  char *src=malloc(SZ); memset(src,1,SZ);
  char *buf=malloc(1<<20); memset(buf,0,1<<20);
  char *src2=malloc(SZ); memset(src2,2,SZ);
  for(int rep=0;rep<3;rep++){
  unlink("/dev/shm/mbt"); int fd=open("/dev/shm/mbt",O_RDWR|O_CREAT,0600);
  double t0=now();
  for(size_t o=0;o<SZ;o+=512<<10){memcpy(buf,src+o,512<<10); pwrite(fd,buf,512<<10,o);}
  double t1=now();
  for(size_t o=0;o<SZ;o+=512<<10){pread(fd,buf,512<<10,o);}
  double t2=now();
  close(fd); unlink("/dev/shm/mbt"); fd=open("/dev/shm/mbt",O_RDWR|O_CREAT,0600); ftruncate(fd,SZ);
  char *m=mmap(0,SZ,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0);
  double t3=now();
  madvise(m,SZ,23);
  double t4=now();
  memcpy(m,src,SZ);
  double t5=now();
  munmap(m,SZ);
  double t6=now();
  char *a=mmap(0,SZ,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  double t7=now();
  madvise(a,SZ,23);
  double t8=now();
  memcpy(a,src,SZ);
  double t9=now();
  munmap(a,SZ);
  double t10=now();
  /* The same pwrite into a file whose pages fallocate reserved first. */
  close(fd); unlink("/dev/shm/mbt"); fd=open("/dev/shm/mbt",O_RDWR|O_CREAT,0600);
  double f0=now();
  fallocate(fd,0,0,SZ);
  double f1=now();
  for(size_t o=0;o<SZ;o+=512<<10){memcpy(buf,src+o,512<<10); pwrite(fd,buf,512<<10,o);}
  double f2=now();
  /* Raw copy speed: memcpy of 100 MiB between two buffers already backed. */
  double c0=now();
  memcpy(src2,src,SZ);
  double c1=now();
  printf("fallocate %.1f then pwrite %.1f | memcpy (backed) %.1f | ",f1-f0,f2-f1,c1-c0);
  printf("pwrite(copy+write) %.1f  pread %.1f | shm populate %.1f memcpy %.1f munmap %.1f | anon populate %.1f memcpy %.1f munmap %.1f\n",t1-t0,t2-t1,t4-t3,t5-t4,t6-t5,t8-t7,t9-t8,t10-t9);
  close(fd);}
  unlink("/dev/shm/mbt");
}
