package io.github.kafkatieredsidecar.plugin;

import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.InterruptedIOException;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.net.SocketTimeoutException;
import java.net.StandardProtocolFamily;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.SocketChannel;
import java.nio.channels.UnresolvedAddressException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.Locale;
import java.util.concurrent.ConcurrentLinkedDeque;

/**
 * A minimal HTTP/1.1 client for the sidecar's local socket: a JSON request body, a response with
 * a {@code Content-Length}.
 *
 * <p>Reads (fetches of segment windows and indexes) reuse idle connections: Kafka serves remote
 * data one fetch at a time, each a {@code fetchLogSegment} call, and a new connection per call
 * costs the sidecar more than the request itself. A connection goes back to the pool only when
 * its response body was read to the end and the sidecar did not ask to close it; one that the
 * sidecar closed while idle is found out before or on the first byte of the next answer, and that
 * request (idempotent: a read) is sent again once on a new connection. Copies and deletes use a
 * connection of their own ({@code Connection: close}): a copy is never sent twice by this client.
 *
 * <p>The channel is non-blocking and every wait goes through a {@link Selector} with a timeout, so
 * no call blocks past its deadline: connecting, writing the request and each read of the response
 * (an idle timeout while a fetch is streamed to the broker). The JDK's blocking {@code SocketChannel}
 * ignores {@code SO_TIMEOUT}, which is why the selector is used.
 */
final class SidecarHttp {

    /**
     * The version of the plugin's requests to {@code /v1/rsm/...}, sent with each of them as
     * {@code X-Sidecar-Rsm-Protocol}: the plugin (in the broker) and the sidecar are upgraded
     * apart, and a sidecar that does not speak this version refuses the request by name
     * (HTTP 400 {@code unsupported_protocol}) instead of misreading it.
     */
    static final int PROTOCOL = 1;

    /** Where the sidecar listens: a Unix domain socket (the default) or a loopback TCP port. */
    static final class Endpoint {
        final Path socketPath;
        final String host;
        final int port;

        private Endpoint(Path socketPath, String host, int port) {
            this.socketPath = socketPath;
            this.host = host;
            this.port = port;
        }

        static Endpoint unix(Path path) {
            return new Endpoint(path, null, -1);
        }

        static Endpoint tcp(String host, int port) {
            return new Endpoint(null, host, port);
        }

        SocketAddress address() {
            return socketPath != null
                    ? UnixDomainSocketAddress.of(socketPath)
                    : new InetSocketAddress(host, port);
        }

        @Override
        public String toString() {
            return socketPath != null ? "unix:" + socketPath : "tcp:" + host + ":" + port;
        }
    }

    /** The status line, the Content-Type and the body of a response; the body is read on demand. */
    static final class Response implements AutoCloseable {
        final int status;
        final long contentLength;
        /** The {@code Content-Type} header's value; null when there is none. */
        final String contentType;
        final BodyStream body;

        Response(int status, long contentLength, String contentType, BodyStream body) {
            this.status = status;
            this.contentLength = contentLength;
            this.contentType = contentType;
            this.body = body;
        }

        /** Whether the body is JSON: {@code Content-Type: application/json}, with any parameters. */
        boolean json() {
            if (contentType == null) {
                return false;
            }
            int semicolon = contentType.indexOf(';');
            String type = semicolon < 0 ? contentType : contentType.substring(0, semicolon);
            return type.trim().equalsIgnoreCase("application/json");
        }

        byte[] readAll() throws IOException {
            if (contentLength > Integer.MAX_VALUE - 8) {
                throw new IOException("response of " + contentLength + " bytes is too large to buffer");
            }
            return body.readNBytes((int) contentLength);
        }

        @Override
        public void close() throws IOException {
            body.close();
        }
    }

    private static final int MAX_HEAD_BYTES = 16 * 1024;
    /** Idle connections kept for reuse; Kafka's remote readers are a small thread pool. */
    static final int MAX_IDLE = 16;
    /** An idle connection older than this is closed rather than reused (the sidecar's idle
     * timeout is longer). */
    static final long MAX_IDLE_NANOS = 15_000_000_000L;

    private final Endpoint endpoint;
    private final int connectTimeoutMs;
    private final ConcurrentLinkedDeque<Connection> idle = new ConcurrentLinkedDeque<>();
    private volatile boolean closed;

    /** An open channel and its selector; {@code idleSince} is set while it is in the pool. */
    static final class Connection implements AutoCloseable {
        final SocketChannel channel;
        final Selector selector;
        boolean reused;
        long idleSince;

        Connection(SocketChannel channel, Selector selector, boolean reused) {
            this.channel = channel;
            this.selector = selector;
            this.reused = reused;
        }

        @Override
        public void close() {
            closeQuietly(selector);
            closeQuietly(channel);
        }
    }

    SidecarHttp(Endpoint endpoint, int connectTimeoutMs) {
        this.endpoint = endpoint;
        this.connectTimeoutMs = connectTimeoutMs;
    }

    Endpoint endpoint() {
        return endpoint;
    }

    /**
     * POST {@code body} to {@code path} on a connection of its own and return the response once
     * its head has arrived. The caller closes the response (which closes the connection).
     * {@code timeoutMs} bounds writing the request and waiting for the response head (the
     * sidecar's work); {@code idleTimeoutMs} bounds each wait for body bytes afterwards.
     */
    Response post(String path, byte[] body, int timeoutMs, int idleTimeoutMs) throws IOException {
        return post(path, body, timeoutMs, idleTimeoutMs, false);
    }

    /**
     * As {@link #post(String, byte[], int, int)}; with {@code reuse} (idempotent requests only) on
     * an idle connection when there is one, which the response's {@code close} hands back.
     */
    Response post(String path, byte[] body, int timeoutMs, int idleTimeoutMs, boolean reuse) throws IOException {
        long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
        if (reuse) {
            Connection pooled;
            while ((pooled = takeIdle()) != null) {
                try {
                    return exchange(pooled, path, body, deadline, idleTimeoutMs, true);
                } catch (StaleConnectionException stale) {
                    // the sidecar closed it while it was idle; the request was not answered
                }
            }
        }
        return exchange(open(), path, body, deadline, idleTimeoutMs, reuse);
    }

    /** The request was not answered on a reused connection: nothing of a response arrived. */
    private static final class StaleConnectionException extends IOException {
        private static final long serialVersionUID = 1L;

        StaleConnectionException(String message) {
            super(message);
        }
    }

    private Connection open() throws IOException {
        SocketChannel channel = endpoint.socketPath != null
                ? SocketChannel.open(StandardProtocolFamily.UNIX)
                : SocketChannel.open(StandardProtocolFamily.INET);
        Selector selector = null;
        try {
            channel.configureBlocking(false);
            selector = Selector.open();
            connect(channel, selector);
            return new Connection(channel, selector, false);
        } catch (UnresolvedAddressException e) {
            // tcp.host did not resolve (a DNS failure may pass): the sidecar cannot be reached
            closeQuietly(selector);
            closeQuietly(channel);
            throw new IOException("cannot resolve the sidecar's host " + endpoint.host, e);
        } catch (IOException | RuntimeException e) {
            closeQuietly(selector);
            closeQuietly(channel);
            throw e;
        }
    }

    private Response exchange(Connection connection, String path, byte[] body, long deadline, int idleTimeoutMs,
            boolean keepAlive) throws IOException {
        boolean handedOver = false;
        try {
            String head = "POST " + path + " HTTP/1.1\r\n"
                    + "Host: sidecar\r\n"
                    + "User-Agent: kafka-tiered-sidecar-plugin\r\n"
                    + "X-Sidecar-Rsm-Protocol: " + PROTOCOL + "\r\n"
                    + "Content-Type: application/json\r\n"
                    + "Content-Length: " + body.length + "\r\n"
                    + (keepAlive ? "" : "Connection: close\r\n") + "\r\n";
            try {
                write(connection.channel, connection.selector,
                        ByteBuffer.wrap(head.getBytes(StandardCharsets.US_ASCII)), deadline);
                write(connection.channel, connection.selector, ByteBuffer.wrap(body), deadline);
            } catch (IOException e) {
                if (connection.reused && !(e instanceof InterruptedIOException)) { // nor a timeout
                    throw new StaleConnectionException("idle connection closed: " + e);
                }
                throw e;
            }
            Response response = readHead(connection, deadline, idleTimeoutMs, keepAlive ? this : null);
            handedOver = true;
            return response;
        } finally {
            if (!handedOver) {
                connection.close();
            }
        }
    }

    /** The newest idle connection that is still open, or null. */
    private Connection takeIdle() {
        Connection connection;
        while ((connection = idle.pollFirst()) != null) {
            if (System.nanoTime() - connection.idleSince < MAX_IDLE_NANOS && stillOpen(connection)) {
                return connection;
            }
            connection.close();
        }
        return null;
    }

    /** An idle connection has nothing to read: a byte or the end of stream means it is unusable. */
    private static boolean stillOpen(Connection connection) {
        try {
            return connection.channel.read(ByteBuffer.allocate(1)) == 0;
        } catch (IOException e) {
            return false;
        }
    }

    /** A response read to its end hands its connection back; a full pool closes it. */
    void release(Connection connection) {
        connection.idleSince = System.nanoTime();
        connection.reused = true;
        if (closed || idle.size() >= MAX_IDLE) {
            connection.close();
            return;
        }
        idle.offerFirst(connection);
        if (closed) {
            closeIdle();
        }
    }

    int idleConnections() {
        return idle.size();
    }

    /** Close every idle connection; later releases close theirs. */
    void close() {
        closed = true;
        closeIdle();
    }

    private void closeIdle() {
        Connection connection;
        while ((connection = idle.pollFirst()) != null) {
            connection.close();
        }
    }

    private void connect(SocketChannel channel, Selector selector) throws IOException {
        if (channel.connect(endpoint.address())) {
            return;
        }
        SelectionKey key = channel.register(selector, SelectionKey.OP_CONNECT);
        long deadline = System.nanoTime() + connectTimeoutMs * 1_000_000L;
        while (!channel.finishConnect()) {
            await(selector, deadline, "connecting to the sidecar at " + endpoint);
        }
        key.interestOps(0);
    }

    private static void write(SocketChannel channel, Selector selector, ByteBuffer buffer, long deadline)
            throws IOException {
        while (buffer.hasRemaining()) {
            if (channel.write(buffer) == 0) {
                SelectionKey key = channel.keyFor(selector);
                key = key == null ? channel.register(selector, SelectionKey.OP_WRITE) : key;
                key.interestOps(SelectionKey.OP_WRITE);
                await(selector, deadline, "sending a request to the sidecar");
                key.interestOps(0);
            }
        }
    }

    /**
     * Wait for the selector's one key until {@code deadline}; a timeout is an exception, and so
     * is an interrupt. Kafka interrupts a copy or delete it gives up on (a leadership move, the
     * partition stopped, broker shutdown), and {@code select} returns at once, forever, on an
     * interrupted thread: without the check the caller would spin until its deadline. The flag
     * stays set; the caller closes the connection, which tells the sidecar to give up too.
     */
    private static void await(Selector selector, long deadline, String what) throws IOException {
        if (Thread.currentThread().isInterrupted()) {
            throw new InterruptedIOException("interrupted " + what);
        }
        long remainingMs = (deadline - System.nanoTime()) / 1_000_000L;
        if (remainingMs <= 0 || selector.select(remainingMs) == 0 && System.nanoTime() >= deadline) {
            throw new SocketTimeoutException("timed out " + what);
        }
        selector.selectedKeys().clear();
    }

    private static Response readHead(Connection connection, long deadline, int idleTimeoutMs, SidecarHttp pool)
            throws IOException {
        SocketChannel channel = connection.channel;
        Selector selector = connection.selector;
        ByteBuffer buffer = ByteBuffer.allocate(MAX_HEAD_BYTES);
        SelectionKey key = channel.keyFor(selector);
        key = key == null ? channel.register(selector, 0) : key;
        int headEnd;
        while ((headEnd = indexOfHeadEnd(buffer)) < 0) {
            if (!buffer.hasRemaining()) {
                throw new IOException("the sidecar's response head is larger than " + MAX_HEAD_BYTES + " bytes");
            }
            int n;
            try {
                n = channel.read(buffer);
            } catch (IOException e) {
                if (connection.reused && buffer.position() == 0) {
                    throw new StaleConnectionException("idle connection reset: " + e);
                }
                throw e;
            }
            if (n < 0) {
                if (connection.reused && buffer.position() == 0) {
                    throw new StaleConnectionException("idle connection closed by the sidecar");
                }
                throw new EOFException("the sidecar closed the connection before answering");
            }
            if (n == 0) {
                key.interestOps(SelectionKey.OP_READ);
                await(selector, deadline, "waiting for the sidecar's answer");
                key.interestOps(0);
            }
        }
        String head = new String(buffer.array(), 0, headEnd, StandardCharsets.ISO_8859_1);
        String[] lines = head.split("\r\n");
        String[] statusLine = lines[0].split(" ", 3);
        if (statusLine.length < 2 || !statusLine[0].startsWith("HTTP/1.")) {
            throw new IOException("not an HTTP response from the sidecar: " + lines[0]);
        }
        int status;
        try {
            status = Integer.parseInt(statusLine[1]);
        } catch (NumberFormatException e) {
            throw new IOException("bad status line from the sidecar: " + lines[0], e);
        }
        long length = -1;
        String contentType = null;
        boolean keepAlive = pool != null;
        for (int i = 1; i < lines.length; i++) {
            int colon = lines[i].indexOf(':');
            if (colon <= 0) {
                continue;
            }
            String name = lines[i].substring(0, colon).trim().toLowerCase(Locale.ROOT);
            String value = lines[i].substring(colon + 1).trim();
            if (name.equals("content-length")) {
                try {
                    length = Long.parseLong(value);
                } catch (NumberFormatException e) {
                    throw new IOException("bad Content-Length from the sidecar: " + value, e);
                }
            } else if (name.equals("content-type")) {
                contentType = value;
            } else if (name.equals("connection") && value.toLowerCase(Locale.ROOT).contains("close")) {
                keepAlive = false;
            } else if (name.equals("transfer-encoding") && !value.equalsIgnoreCase("identity")) {
                throw new IOException("the sidecar answered with Transfer-Encoding " + value
                        + "; this client reads Content-Length bodies only");
            }
        }
        if (length < 0) {
            throw new IOException("the sidecar's response has no Content-Length");
        }
        buffer.flip();
        buffer.position(headEnd + 4);
        if (buffer.remaining() > length) {
            keepAlive = false;  // bytes past the body: not a connection to send another request on
        }
        return new Response(status, length, contentType,
                new BodyStream(connection, buffer, length, idleTimeoutMs, keepAlive ? pool : null));
    }

    private static int indexOfHeadEnd(ByteBuffer buffer) {
        byte[] a = buffer.array();
        for (int i = 0; i + 3 < buffer.position(); i++) {
            if (a[i] == '\r' && a[i + 1] == '\n' && a[i + 2] == '\r' && a[i + 3] == '\n') {
                return i;
            }
        }
        return -1;
    }

    static void closeQuietly(AutoCloseable closeable) {
        if (closeable == null) {
            return;
        }
        try {
            closeable.close();
        } catch (Exception ignored) {
            // closing a connection we are done with: nothing to recover
        }
    }

    /**
     * A response body of a known length, read from the channel with an idle timeout per wait.
     * Reading past the length gives -1; a connection that ends early is an {@link EOFException}
     * (a truncated response, never a short one taken for complete). Closing it after the last
     * byte hands a keep-alive connection back to its pool. Closing it earlier with at most
     * {@value #DRAIN_MAX_BYTES} bytes left reads and drops them and hands the connection back
     * too (a few KiB read locally cost less than a new connection and a response the sidecar
     * sees cut); with more left, or if that read fails, the connection is closed.
     */
    static final class BodyStream extends InputStream {
        private static final int BUFFER_BYTES = 64 * 1024;
        static final int DRAIN_MAX_BYTES = 256 * 1024;
        private final Connection connection;
        private final int idleTimeoutMs;
        private final SidecarHttp pool;
        private ByteBuffer buffer;
        private long remaining;
        private boolean closed;
        private boolean failed;
        /** The connection was handed back (or closed) once the whole body was read. */
        private boolean released;

        BodyStream(Connection connection, ByteBuffer initial, long length, int idleTimeoutMs, SidecarHttp pool) {
            this.connection = connection;
            this.idleTimeoutMs = idleTimeoutMs;
            this.pool = pool;
            this.buffer = initial;
            this.remaining = length;
            if (buffer.remaining() > remaining) {
                buffer.limit(buffer.position() + (int) remaining);
            }
        }

        @Override
        public int read() throws IOException {
            byte[] one = new byte[1];
            int n = read(one, 0, 1);
            return n < 0 ? -1 : one[0] & 0xff;
        }

        @Override
        public int read(byte[] b, int off, int len) throws IOException {
            if (closed) {
                throw new IOException("stream closed");
            }
            if (len == 0) {
                return 0;
            }
            if (remaining == 0) {
                return -1;
            }
            if (!buffer.hasRemaining()) {
                try {
                    fill();
                } catch (IOException e) {
                    failed = true;
                    throw e;
                }
            }
            int n = Math.min(len, buffer.remaining());
            buffer.get(b, off, n);
            remaining -= n;
            releaseAtEnd();
            return n;
        }

        /**
         * Once the whole body is read, hand the connection back at once: a caller that reads a
         * stream to its end and never closes it (Kafka's reader does, on one path) would
         * otherwise hold its socket for good, since the JDK never reclaims an unclosed channel.
         */
        private void releaseAtEnd() {
            if (remaining == 0 && !released && !failed) {
                released = true;
                if (pool != null) {
                    pool.release(connection);
                } else {
                    connection.close();
                }
            }
        }

        @Override
        public int available() {
            return closed ? 0 : buffer.remaining();
        }

        /**
         * The whole rest of the body, read straight into one array (no copy through the stream's
         * buffer); the stream is then at its end.
         */
        byte[] readRest() throws IOException {
            if (closed) {
                throw new IOException("stream closed");
            }
            if (remaining > Integer.MAX_VALUE - 8) {
                throw new IOException("response of " + remaining + " bytes is too large to buffer");
            }
            byte[] all = new byte[(int) remaining];
            int buffered = Math.min(all.length, buffer.remaining());
            buffer.get(all, 0, buffered);
            ByteBuffer target = ByteBuffer.wrap(all, buffered, all.length - buffered);
            try {
                while (target.hasRemaining()) {
                    if (readSome(target) < 0) {
                        throw new EOFException("the sidecar's response ended " + target.remaining() + " bytes early");
                    }
                }
            } catch (IOException e) {
                failed = true;
                throw e;
            }
            remaining = 0;
            releaseAtEnd();
            return all;
        }

        /** One read of the channel into {@code target}, waiting up to the idle deadline. */
        private int readSome(ByteBuffer target) throws IOException {
            SocketChannel channel = connection.channel;
            Selector selector = connection.selector;
            SelectionKey key = channel.keyFor(selector);
            key = key == null ? channel.register(selector, 0) : key;
            long deadline = System.nanoTime() + idleTimeoutMs * 1_000_000L;
            int n;
            while ((n = channel.read(target)) == 0) {
                key.interestOps(SelectionKey.OP_READ);
                await(selector, deadline, "reading the sidecar's response (idle " + idleTimeoutMs + " ms)");
                key.interestOps(0);
            }
            return n;
        }

        private void fill() throws IOException {
            if (buffer.capacity() < BUFFER_BYTES) {
                buffer = ByteBuffer.allocate(BUFFER_BYTES);
            }
            buffer.clear();
            if (buffer.remaining() > remaining) {
                buffer.limit((int) remaining);
            }
            int n = readSome(buffer);
            buffer.flip();
            if (n < 0) {
                throw new EOFException("the sidecar's response ended " + remaining + " bytes early");
            }
        }

        @Override
        public void close() {
            if (!closed) {
                closed = true;
                if (released) {
                    return; // handed back when its end was read
                }
                if (pool != null && !failed && remaining > 0 && remaining <= DRAIN_MAX_BYTES) {
                    drain();
                }
                released = true;
                if (pool != null && remaining == 0 && !failed) {
                    pool.release(connection);
                } else {
                    connection.close();
                }
            }
        }

        /** Read the rest of the body and drop it; a failure leaves the stream failed. */
        private void drain() {
            try {
                while (remaining > 0) {
                    if (!buffer.hasRemaining()) {
                        fill();
                    }
                    int n = (int) Math.min(remaining, buffer.remaining());
                    buffer.position(buffer.position() + n);
                    remaining -= n;
                }
            } catch (IOException e) {
                failed = true;
            }
        }
    }
}
