/* C stdio: `fgets FILE` copies FILE to stdout line by line through fgets with a small
 * buffer (a line longer than it comes in pieces), as C programs read /proc files. */
#include <stdio.h>

int main(int argc, char **argv) {
    char buf[64];
    FILE *f;
    if (argc != 2 || (f = fopen(argv[1], "r")) == NULL) {
        perror("fopen");
        return 2;
    }
    while (fgets(buf, sizeof buf, f) != NULL)
        fputs(buf, stdout);
    if (ferror(f)) {
        perror("fgets");
        return 1;
    }
    fclose(f);
    return 0;
}
