// The browser sample's model worker: importing the worker entry serves Florence2Worker's requests;
// `expose` serves them on another scope too.
import "florence2-wasm/worker";
import { expose } from "florence2-wasm/worker";

const channel = new MessageChannel();
channel.port1.start();
expose(channel.port1);
