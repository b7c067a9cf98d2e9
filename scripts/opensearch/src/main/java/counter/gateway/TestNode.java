package counter.gateway;

import java.io.IOException;
import java.io.InputStream;
import java.io.PrintStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Comparator;
import java.util.List;
import java.util.Locale;
import java.util.ServiceLoader;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;

import org.apache.logging.log4j.Level;
import org.apache.logging.log4j.LogManager;
import org.apache.logging.log4j.core.appender.ConsoleAppender;
import org.apache.logging.log4j.core.config.Configurator;
import org.apache.logging.log4j.core.config.builder.api.ConfigurationBuilder;
import org.apache.logging.log4j.core.config.builder.api.ConfigurationBuilderFactory;
import org.apache.logging.log4j.core.config.builder.impl.BuiltConfiguration;
import org.opensearch.analysis.common.CommonAnalysisPlugin;
import org.opensearch.common.settings.Settings;
import org.opensearch.env.Environment;
import org.opensearch.http.HttpServerTransport;
import org.opensearch.index.mapper.MapperExtrasPlugin;
import org.opensearch.index.reindex.ReindexPlugin;
import org.opensearch.node.InternalSettingsPreparer;
import org.opensearch.node.Node;
import org.opensearch.painless.PainlessPlugin;
import org.opensearch.plugins.ExtensiblePlugin;
import org.opensearch.plugins.Plugin;
import org.opensearch.transport.Netty4Plugin;

/**
 * A single-node OpenSearch for integration tests, built from Maven Central jars.
 *
 * <p>Prints exactly one line {@code OPENSEARCH_URL=http://127.0.0.1:PORT} on stdout once the
 * cluster is at least yellow; all logging goes to stderr. Closes the node and removes its
 * temporary home on SIGTERM/SIGINT, on stdin EOF (if asked) and when a watched parent exits.
 *
 * <p>Options (flag or environment variable):
 * <ul>
 *   <li>{@code OPENSEARCH_PORT} fixed HTTP port (default: an ephemeral one)</li>
 *   <li>{@code OPENSEARCH_TRANSPORT_PORT} fixed transport port (default: an ephemeral one)</li>
 *   <li>{@code OPENSEARCH_DATA_DIR} persistent home/data dir, kept on exit (default: a fresh temp dir, deleted on exit)</li>
 *   <li>{@code --watch-stdin} / {@code OPENSEARCH_WATCH_STDIN=1}: exit when stdin reaches EOF</li>
 *   <li>{@code --parent-pid N} / {@code OPENSEARCH_PARENT_PID=N}: exit when process N exits</li>
 *   <li>{@code OPENSEARCH_LOG_LEVEL} root log level (default: WARN)</li>
 *   <li>{@code OPENSEARCH_CLUSTER_NAME} (default: counter-gateway-test)</li>
 *   <li>{@code OPENSEARCH_NODE_NAME} (default: node-0)</li>
 *   <li>{@code OPENSEARCH_SEED_HOSTS} comma-separated {@code host:transport_port} of the other
 *       nodes: a cluster member instead of a single node (with {@code OPENSEARCH_INITIAL_MANAGERS},
 *       the node names that elect the first cluster manager; every member names the same ones)</li>
 * </ul>
 *
 * <p>A cluster member prints its URL once the cluster it joined is yellow: start all members at
 * once, or the first waits for the others.</p>
 */
public final class TestNode {

    static final List<Class<? extends Plugin>> PLUGINS = List.of(
        Netty4Plugin.class,
        PainlessPlugin.class,
        CommonAnalysisPlugin.class,
        MapperExtrasPlugin.class,
        ReindexPlugin.class
    );

    /** Node's constructor taking classpath plugins is protected. */
    static final class ClasspathNode extends Node {
        ClasspathNode(Environment environment, Collection<Class<? extends Plugin>> plugins) {
            super(environment, plugins, true);
        }
    }

    private static final PrintStream STDOUT = System.out;
    private static volatile Node node;
    private static volatile Path tempHome;

    public static void main(String[] args) throws Exception {
        boolean watchStdin = "1".equals(System.getenv("OPENSEARCH_WATCH_STDIN"));
        String parentPid = System.getenv("OPENSEARCH_PARENT_PID");
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--watch-stdin":
                    watchStdin = true;
                    break;
                case "--parent-pid":
                    parentPid = args[++i];
                    break;
                default:
                    System.err.println("usage: TestNode [--watch-stdin] [--parent-pid PID]");
                    System.exit(2);
            }
        }
        // Nothing but the URL line goes to stdout.
        System.setOut(System.err);
        configureLogging(env("OPENSEARCH_LOG_LEVEL", "WARN"));

        final String dataDir = System.getenv("OPENSEARCH_DATA_DIR");
        final Path home;
        if (dataDir != null && !dataDir.isEmpty()) {
            home = Paths.get(dataDir).toAbsolutePath();
            Files.createDirectories(home);
        } else {
            home = Files.createTempDirectory("counter-gateway-opensearch-");
            tempHome = home;
        }

        Runtime.getRuntime().addShutdownHook(new Thread(TestNode::shutdown, "test-node-shutdown"));
        if (watchStdin) {
            Thread t = new Thread(TestNode::exitOnStdinEof, "test-node-stdin-watch");
            t.setDaemon(true);
            t.start();
        }
        if (parentPid != null && !parentPid.isEmpty()) {
            long pid = Long.parseLong(parentPid.trim());
            ProcessHandle.of(pid).ifPresentOrElse(
                ph -> ph.onExit().thenRun(() -> exit("parent process " + pid + " exited", 0)),
                () -> exit("parent process " + pid + " is not running", 1)
            );
        }

        final String nodeName = env("OPENSEARCH_NODE_NAME", "node-0");
        final String seeds = env("OPENSEARCH_SEED_HOSTS", "");
        Settings.Builder builder = Settings.builder()
            .put("cluster.name", env("OPENSEARCH_CLUSTER_NAME", "counter-gateway-test"))
            .put("node.name", nodeName)
            .put("path.home", home.toString())
            .put("path.data", home.resolve("data").toString())
            .put("path.logs", home.resolve("logs").toString());
        if (seeds.isEmpty()) {
            builder.put("discovery.type", "single-node");
        } else {
            builder.putList("discovery.seed_hosts", List.of(seeds.split(",")))
                .putList("cluster.initial_cluster_manager_nodes",
                    List.of(env("OPENSEARCH_INITIAL_MANAGERS", nodeName).split(",")))
                // A lost node is noticed in seconds, not the default 30 s+ (tests kill nodes).
                .put("cluster.fault_detection.follower_check.interval", "500ms")
                .put("cluster.fault_detection.follower_check.timeout", "2s")
                .put("cluster.fault_detection.follower_check.retry_count", 2)
                .put("cluster.fault_detection.leader_check.interval", "500ms")
                .put("cluster.fault_detection.leader_check.timeout", "2s")
                .put("cluster.fault_detection.leader_check.retry_count", 2);
        }
        Settings settings = builder
            .put("network.host", "127.0.0.1")
            .put("http.port", env("OPENSEARCH_PORT", "0"))
            .put("transport.port", env("OPENSEARCH_TRANSPORT_PORT", "0"))
            .put("cluster.routing.allocation.disk.threshold_enabled", false)
            .put("cluster.info.update.interval", "1m")
            .build();

        loadPainlessExtensions();
        long t0 = System.nanoTime();
        Environment environment = InternalSettingsPreparer.prepareEnvironment(settings, java.util.Map.of(), null, () -> nodeName);
        try {
            node = new ClasspathNode(environment, PLUGINS);
            node.start();
        } catch (Throwable e) {
            System.err.println("opensearch test node: failed to start: " + e);
            e.printStackTrace();
            exit("start failure", 1);
            return;
        }
        int port = node.injector().getInstance(HttpServerTransport.class).boundAddress().publishAddress().getPort();
        String url = "http://127.0.0.1:" + port;
        waitForYellow(url);
        System.err.printf(Locale.ROOT, "opensearch test node: yellow after %d ms, home %s%n",
            TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0), home);
        STDOUT.println("OPENSEARCH_URL=" + url);
        STDOUT.flush();
        new CountDownLatch(1).await();
    }

    /**
     * Classpath plugins are not given their SPI extensions by PluginsService (only plugin bundles
     * are). Painless keeps its per-context allowlists in a static map, so hand it the extensions
     * found on the classpath (e.g. analysis-common's) before the node builds the script engine.
     */
    static void loadPainlessExtensions() {
        new PainlessPlugin().loadExtensions(new ExtensiblePlugin.ExtensionLoader() {
            @Override
            public <T> List<T> loadExtensions(Class<T> type) {
                List<T> found = new ArrayList<>();
                ServiceLoader.load(type, TestNode.class.getClassLoader()).forEach(found::add);
                return found;
            }
        });
    }

    static void waitForYellow(String url) throws Exception {
        HttpClient client = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();
        HttpRequest req = HttpRequest.newBuilder(URI.create(url + "/_cluster/health?wait_for_status=yellow&timeout=30s"))
            .timeout(Duration.ofSeconds(40)).GET().build();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(170);
        String last = "";
        while (System.nanoTime() < deadline) {
            try {
                HttpResponse<String> resp = client.send(req, HttpResponse.BodyHandlers.ofString());
                last = resp.statusCode() + " " + resp.body();
                if (resp.statusCode() == 200
                    && (resp.body().contains("\"status\":\"yellow\"") || resp.body().contains("\"status\":\"green\""))) {
                    return;
                }
            } catch (IOException e) {
                last = e.toString();
            }
            Thread.sleep(250);
        }
        throw new IllegalStateException("cluster did not reach yellow: " + last);
    }

    static void exitOnStdinEof() {
        byte[] buf = new byte[256];
        try {
            InputStream in = System.in;
            while (in.read(buf) >= 0) {
                // discard
            }
        } catch (IOException e) {
            // treat as EOF
        }
        exit("stdin closed", 0);
    }

    static void exit(String why, int code) {
        System.err.println("opensearch test node: exiting: " + why);
        // System.exit runs the shutdown hook; do it off the calling thread (may be a CompletableFuture pool thread).
        Thread t = new Thread(() -> System.exit(code), "test-node-exit");
        t.start();
    }

    static synchronized void shutdown() {
        Node n = node;
        node = null;
        if (n != null) {
            try {
                n.close();
                if (!n.awaitClose(30, TimeUnit.SECONDS)) {
                    System.err.println("opensearch test node: node did not close within 30s");
                }
            } catch (Throwable e) {
                System.err.println("opensearch test node: error closing node: " + e);
            }
        }
        Path home = tempHome;
        tempHome = null;
        if (home != null) {
            deleteTree(home);
        }
        LogManager.shutdown();
    }

    static void deleteTree(Path root) {
        if (!Files.exists(root)) {
            return;
        }
        try (Stream<Path> walk = Files.walk(root)) {
            walk.sorted(Comparator.reverseOrder()).forEach(p -> {
                try {
                    Files.deleteIfExists(p);
                } catch (IOException e) {
                    System.err.println("opensearch test node: cannot delete " + p + ": " + e);
                }
            });
        } catch (IOException e) {
            System.err.println("opensearch test node: cannot delete " + root + ": " + e);
        }
    }

    static void configureLogging(String level) {
        ConfigurationBuilder<BuiltConfiguration> b = ConfigurationBuilderFactory.newConfigurationBuilder();
        b.setStatusLevel(Level.ERROR);
        b.setShutdownHook("disable"); // our shutdown hook logs while closing the node, then stops log4j
        b.add(b.newAppender("stderr", "Console")
            .addAttribute("target", ConsoleAppender.Target.SYSTEM_ERR)
            .add(b.newLayout("PatternLayout").addAttribute("pattern", "[%d{ISO8601}][%-5p][%c{1.}] %m%n")));
        b.add(b.newRootLogger(Level.toLevel(level, Level.WARN)).add(b.newAppenderRef("stderr")));
        // keep the "started"/"closed" lines even at WARN
        b.add(b.newLogger("org.opensearch.node.Node", Level.INFO).add(b.newAppenderRef("stderr")).addAttribute("additivity", false));
        Configurator.initialize(b.build());
    }

    private static String env(String name, String dflt) {
        String v = System.getenv(name);
        return v == null || v.isEmpty() ? dflt : v;
    }
}
