/* Takes the shared cache's lock the way libvgpu does (an OFD write lock on the byte just past the
 * 2008952-byte region), prints "locked" and waits to be killed. Used to show that a holder killed with
 * SIGKILL does not wedge the container. */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    int fd = open(argv[1], O_RDWR | O_CREAT, 0666);
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 2008952, .l_len = 1};
    if (fd < 0 || fcntl(fd, F_OFD_SETLKW, &fl) != 0) {
        perror("lock");
        return 1;
    }
    printf("locked\n");
    fflush(stdout);
    for (;;)
        pause();
}
