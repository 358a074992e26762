// Every way the JVM reads a small file, run as `java Reads.java FILE...` (the source
// launcher: no build step). Prints one line per (method, file): method TAB file TAB the
// bytes read in base64, or "!" and the exception. Lines read by readAllLines and
// BufferedReader are joined back with "\n" after each one.
import java.io.BufferedReader;
import java.io.FileInputStream;
import java.io.FileReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Base64;
import java.util.List;

public class Reads {
    interface Reader { byte[] read(String path) throws Exception; }

    static byte[] lines(List<String> lines) {
        StringBuilder sb = new StringBuilder();
        for (String line : lines) sb.append(line).append('\n');
        return sb.toString().getBytes(StandardCharsets.UTF_8);
    }

    static byte[] buffered(String path) throws Exception {
        try (BufferedReader r = new BufferedReader(new FileReader(path))) {
            return lines(r.lines().toList());
        }
    }

    static byte[] stream(String path) throws Exception {
        try (FileInputStream in = new FileInputStream(path)) {
            return in.readAllBytes();
        }
    }

    static void run(String method, String path, Reader reader) {
        String out;
        try {
            out = Base64.getEncoder().encodeToString(reader.read(path));
        } catch (Exception e) {
            out = "!" + e;
        }
        System.out.println(method + "\t" + path + "\t" + out);
    }

    public static void main(String[] args) {
        for (String path : args) {
            run("java-readAllBytes", path, p -> Files.readAllBytes(Path.of(p)));
            run("java-readAllLines", path, p -> lines(Files.readAllLines(Path.of(p))));
            run("java-BufferedReader", path, Reads::buffered);
            run("java-FileInputStream", path, Reads::stream);
        }
    }
}
