// An HTTP server for crates/ferry/tests/runtimes.rs, run as a single-file
// program (`java CounterServer.java PORT [ADDRESS]`). It listens on the
// JVM's default socket, an IPv6 one on [::] that takes IPv4 connections
// too, or bound to ADDRESS (an IPv4 address: the JVM binds its IPv6
// socket to the IPv4-mapped ::ffff:ADDRESS), and
// keeps a counter in memory: every GET /count adds one and answers the new
// value, so a restored server that lost its memory answers a lower number.
// GET /hello answers without counting. Connections are kept alive.

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicLong;

public class CounterServer {
    private static final AtomicLong COUNT = new AtomicLong();

    private static void answer(HttpExchange ex, String body) throws IOException {
        byte[] b = body.getBytes(StandardCharsets.UTF_8);
        ex.getResponseHeaders().set("Content-Type", "text/plain");
        ex.sendResponseHeaders(200, b.length);
        try (OutputStream os = ex.getResponseBody()) {
            os.write(b);
        }
    }

    public static void main(String[] args) throws IOException {
        int port = Integer.parseInt(args[0]);
        InetSocketAddress at = args.length > 1
                ? new InetSocketAddress(InetAddress.getByName(args[1]), port)
                : new InetSocketAddress(port);
        HttpServer server = HttpServer.create(at, 64);
        server.createContext("/count", ex -> answer(ex, COUNT.incrementAndGet() + "\n"));
        server.createContext("/hello", ex -> answer(ex, "hello\n"));
        server.setExecutor(Executors.newFixedThreadPool(4));
        server.start();
        System.out.println("listening on " + server.getAddress());
    }
}
