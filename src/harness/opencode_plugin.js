// Tells the waitpoint MCP server which OpenCode session calls it, and wakes an idle session
// in place when one of its waitpoints lands. OpenCode gives an MCP server no session id, and
// one server serves every session of an OpenCode process: the session is added to each
// waitpoint tool call here. For each session that goes idle, a `waitpoint adapter
// opencode-waiter` child holds the session's waiter role; it prints the session's wakes as a
// JSON line, this hands them to the session with promptAsync, and only then says "ack" (the
// wakes are marked read; anything else leaves them unread). The child exits when this process
// goes (its stdin closes) or OpenCode exits. Nothing here runs under `opencode run` (nobody is
// idle there, and a waiter would only hold the run up) nor inside a waitpoint resume.
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";

export const WaitpointPlugin = async ({ client, directory }) => {
  // OpenCode's own argv: [bun, its script, subcommand or project, ...]; `run` is headless.
  const command = process.argv.slice(2).find((a) => !a.startsWith("-"));
  const headless = !!process.env.WAITPOINT_RESUMING || command === "run";
  const waiters = new Map();

  const waiterOf = (sessionID) => {
    let w = waiters.get(sessionID);
    if (w) return w;
    const child = spawn(
      WAITPOINT[0],
      [
        ...WAITPOINT.slice(1),
        "adapter", "opencode-waiter", "--session", sessionID, "--dir", directory,
      ],
      { stdio: ["pipe", "pipe", "inherit"] },
    );
    w = { child, asked: false };
    waiters.set(sessionID, w);
    const forget = () => {
      if (waiters.get(sessionID) === w) waiters.delete(sessionID);
    };
    child.on("exit", forget);
    child.on("error", forget);
    child.stdin.on("error", () => {});
    createInterface({ input: child.stdout }).on("line", async (line) => {
      w.asked = false;
      let answer = "nack";
      try {
        const { text } = JSON.parse(line);
        await client.session.promptAsync({
          path: { id: sessionID },
          body: { parts: [{ type: "text", text }] },
        });
        answer = "ack";
      } catch (e) {
        answer = "nack";
      }
      if (!child.stdin.destroyed) child.stdin.write(answer + "\n");
    });
    return w;
  };

  return {
    "tool.execute.before": async (input, output) => {
      if (input.tool.startsWith("waitpoint_") && output.args && typeof output.args === "object") {
        output.args.harness_session = input.sessionID;
      }
    },
    event: async ({ event }) => {
      if (headless || event.type !== "session.idle") return;
      const sessionID = event.properties && event.properties.sessionID;
      if (typeof sessionID !== "string") return;
      const w = waiterOf(sessionID);
      if (!w.asked && !w.child.stdin.destroyed) {
        w.asked = true;
        w.child.stdin.write("wait\n");
      }
    },
    dispose: async () => {
      for (const w of waiters.values()) w.child.stdin.end();
    },
  };
};
