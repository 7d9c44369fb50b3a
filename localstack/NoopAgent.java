/*
 * Stand-in for LocalStack's ddb-local-loader-0.1.jar (a java agent that patches
 * DynamoDB Local to allow more than 20 GSIs, downloaded from a host that is not
 * reachable here). LocalStack always starts DynamoDB Local with
 * -javaagent:.../ddb-local-loader-0.1.jar, so a jar with a Premain-Class must
 * exist; this one does nothing. lsctl.py compiles it and zips it into the jar.
 */
public final class NoopAgent {
    private NoopAgent() {
    }

    public static void premain(String args, java.lang.instrument.Instrumentation inst) {
        // intentionally empty
    }
}
